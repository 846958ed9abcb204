//! A partition's committed log, read at the record-batch level (docs/sinks.md §7.7).
