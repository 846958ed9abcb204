//! The body of a successful data-plane response, taken from the SDK before it deserialises it.
//!
//! Scan, Query and GetRecords are sent by the SDK's own client, so the request is built,
//! signed (SigV4, credentials from the SDK config), routed (region, `endpoint_url`) and its
//! errors parsed exactly as for every other call. Only a successful answer's body is taken:
//! [`TakeBody`] swaps it for `{}` before the SDK reads it, so the SDK deserialises an empty
//! output, and [`TakeBody::collect`] then reads the real body for the wire decoder. An error
//! answer is left alone: the SDK reads its `__type` / `x-amzn-ErrorType` as before, and
//! `api_error` classifies it by that code.
//!
//! # Memory
//! A body is copied into one contiguous buffer for the parser. Buffers come from
//! [`BodyBuffers`] and go back to it once the page is decoded: a fresh megabyte per page would
//! cost more in page faults than the copy itself. At most [`KEPT_BUFFERS`] are kept.

use std::ops::Deref;
use std::sync::{Arc, Mutex};

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::BeforeDeserializationInterceptorContextMut;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::body::SdkBody;
use aws_smithy_types::byte_stream::ByteStream;
use aws_smithy_types::config_bag::ConfigBag;

use crate::error::ApiError;

/// Takes the body of one successful response; add it to one operation with `customize()`.
#[derive(Debug, Clone, Default)]
pub(crate) struct TakeBody {
    taken: Arc<Mutex<Option<SdkBody>>>,
}

impl TakeBody {
    /// Reads the whole body taken from the response into a buffer of `buffers`.
    pub(crate) async fn collect<'b>(&self, buffers: &'b BodyBuffers) -> Result<Body<'b>, ApiError> {
        let body = self
            .taken
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
            .ok_or_else(|| ApiError::transport("the response had no body"))?;
        let bytes = ByteStream::new(body).collect().await.map_err(|error| {
            ApiError::transport(format!("reading the response failed: {error}"))
        })?;
        let mut buffer = buffers.take();
        for segment in bytes.into_segments() {
            buffer.extend_from_slice(&segment);
        }
        Ok(Body { buffer, buffers })
    }
}

/// Response bodies kept for reuse.
pub(crate) const KEPT_BUFFERS: usize = 4;

/// Buffers for response bodies, shared by the requests of one client.
#[derive(Debug, Default)]
pub(crate) struct BodyBuffers {
    free: Mutex<Vec<Vec<u8>>>,
}

impl BodyBuffers {
    fn take(&self) -> Vec<u8> {
        self.free
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop()
            .unwrap_or_default()
    }

    fn give(&self, mut buffer: Vec<u8>) {
        let mut free = self
            .free
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if free.len() < KEPT_BUFFERS {
            buffer.clear();
            free.push(buffer);
        }
    }
}

/// A whole response body; its buffer goes back to the [`BodyBuffers`] when dropped.
#[derive(Debug)]
pub(crate) struct Body<'b> {
    buffer: Vec<u8>,
    buffers: &'b BodyBuffers,
}

impl Deref for Body<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.buffer
    }
}

impl Drop for Body<'_> {
    fn drop(&mut self) {
        self.buffers.give(std::mem::take(&mut self.buffer));
    }
}

impl Intercept for TakeBody {
    fn name(&self) -> &'static str {
        "TakeBody"
    }

    fn modify_before_deserialization(
        &self,
        context: &mut BeforeDeserializationInterceptorContextMut<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let response = context.response_mut();
        if response.status().is_success() {
            let body = std::mem::replace(response.body_mut(), SdkBody::from("{}"));
            *self
                .taken
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(body);
        }
        Ok(())
    }
}
