//! What a program gave a pipeline in code, beside its config: a sink (`type: custom`) and a
//! checkpoint store in place of the state file.

use crate::sink::GivenSink;
use crate::store::GivenStore;

/// The parts of a pipeline given in code.
#[derive(Debug, Clone, Default)]
pub struct Given {
    /// The sink of a `sink: {type: custom}` config.
    pub sink: Option<GivenSink>,
    /// Where the position is kept instead of the state file (jsonl and custom sinks).
    pub store: Option<GivenStore>,
    /// The SDK configuration every client is built from, in place of the source's region,
    /// credentials and endpoint.
    pub sdk: Option<ddbpipe_source::aws::SdkSettings>,
}
