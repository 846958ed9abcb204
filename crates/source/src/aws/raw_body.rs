//! The body of a successful data-plane response, taken from the SDK before it deserialises it.
//!
//! Scan, Query and GetRecords are sent by the SDK's own client, so the request is built,
//! signed (SigV4, credentials from the SDK config), routed (region, `endpoint_url`) and its
//! errors parsed exactly as for every other call. Only a successful answer's body is taken:
//! [`TakeBody`] swaps it for `{}` before the SDK reads it, so the SDK deserialises an empty
//! output, and [`TakeBody::collect`] then reads the real body for the wire decoder. An error
//! answer is left alone: the SDK reads its `__type` / `x-amzn-ErrorType` as before, and
//! `api_error` classifies it by that code.

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
    /// Reads the whole body taken from the response. The SDK returned success, so there was a
    /// successful response and its body was taken.
    pub(crate) async fn collect(&self) -> Result<impl Deref<Target = [u8]> + use<>, ApiError> {
        let body = self
            .taken
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
            .ok_or_else(|| ApiError::transport("the response had no body"))?;
        let bytes = ByteStream::new(body).collect().await.map_err(|error| {
            ApiError::transport(format!("reading the response failed: {error}"))
        })?;
        // One copy into contiguous memory (`to_vec` would copy byte by byte).
        Ok(bytes.into_bytes())
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
