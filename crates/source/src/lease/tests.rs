//! Unit tests of the lease decisions and the worker.
