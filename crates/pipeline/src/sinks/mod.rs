//! The sinks batches are written to (the keyed sinks live in `ddbpipe-keyed`).

pub mod jsonl;
