//! The `custom` sink (docs/sinks.md §7.5): a sink the program that embeds ddbpipe gives in
//! code (`Pipeline::with_sink`, the public trait in `crate::sink`); it has no keys, and a run
//! without one given is refused.

use anyhow::anyhow;

use crate::failure::Failure;

/// Why a `type: custom` pipeline without a sink given in code cannot run (`run` and `check`).
pub const NO_CUSTOM_SINK: &str = "sink.type: custom is a sink given in code by the program \
     that embeds ddbpipe (Pipeline::with_sink); this run has none: set sink.type to jsonl, \
     sqlite or postgres";

/// The failure of a `type: custom` pipeline run without a sink given in code (exit 2).
pub fn no_custom_sink() -> Failure {
    Failure::usage(anyhow!("config error: {NO_CUSTOM_SINK}"))
}
