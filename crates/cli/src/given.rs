//! What a program gave a pipeline in code, beside its config: a sink (`type: custom`) and a
//! checkpoint store in place of the state file, or the loop that takes the batches.

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
    /// Where a driven run hands its batches (`Pipeline::batches`), in place of the sink.
    pub driven: Option<ddbpipe_pipeline::driven::HandOut>,
}
