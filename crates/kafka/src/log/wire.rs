//! One connection to a Kafka broker, PLAINTEXT or TLS (`tls`): requests framed and answered
//! in turn, in the versions both sides speak (rule 1 of the [module docs](super)).
//!
//! A request goes out as `int32 length`, the request header, the body; its answer comes back
//! as `int32 length`, the response header (whose correlation id must be the request's), the
//! body. Every connect and every request is bounded by the reader's timeout.

use std::collections::HashMap;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::ResponseError;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, RequestHeader, ResponseHeader,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::LogError;
use super::tls::{self, Security};

/// A connection's socket: plain TCP, or TLS over it.
#[derive(Debug)]
enum Socket {
    /// PLAINTEXT.
    Plain(TcpStream),
    /// SSL.
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl Socket {
    /// Writes all of `bytes`, and flushes them (TLS buffers its records).
    async fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            Socket::Plain(tcp) => tcp.write_all(bytes).await,
            Socket::Tls(tls) => {
                tls.write_all(bytes).await?;
                tls.flush().await
            }
        }
    }

    /// Reads exactly `buffer.len()` bytes.
    async fn read_exact(&mut self, buffer: &mut [u8]) -> std::io::Result<()> {
        match self {
            Socket::Plain(tcp) => tcp.read_exact(buffer).await.map(drop),
            Socket::Tls(tls) => tls.read_exact(buffer).await.map(drop),
        }
    }

    /// Reads a big-endian `int32`.
    async fn read_i32(&mut self) -> std::io::Result<i32> {
        let mut bytes = [0; 4];
        self.read_exact(&mut bytes).await?;
        Ok(i32::from_be_bytes(bytes))
    }
}

/// The `client.id` the broker sees (its logs and quotas).
const CLIENT_ID: &str = "ddbpipe-log";
/// The largest answer read: a fetch is asked for far less (`FETCH_MAX_BYTES`).
const MAX_RESPONSE_BYTES: usize = 256 << 20;
/// The ApiVersions version asked first; a broker that does not serve it answers in v0.
const API_VERSIONS_ASKED: i16 = 3;
/// The error code of a request version the broker does not serve.
const UNSUPPORTED_VERSION: i16 = 35;

/// A request this reader sends, with the versions it speaks: from the first that has every
/// field it needs, to the last whose fields it knows.
#[derive(Debug, Clone, Copy)]
pub(super) struct Api {
    /// The request's API key.
    pub(super) key: ApiKey,
    /// The request's name in errors.
    pub(super) name: &'static str,
    /// The lowest version spoken.
    pub(super) min: i16,
    /// The highest version spoken.
    pub(super) max: i16,
}

/// Metadata: from v4 a request can refuse to create the topic it asks about; v13 adds nothing
/// read here.
pub(super) const METADATA: Api = Api {
    key: ApiKey::Metadata,
    name: "Metadata",
    min: 4,
    max: 12,
};
/// ListOffsets: v1 is the first with one timestamp per partition; past v7 nothing read here
/// changes.
pub(super) const LIST_OFFSETS: Api = Api {
    key: ApiKey::ListOffsets,
    name: "ListOffsets",
    min: 1,
    max: 7,
};
/// Fetch: v4 is the first with an isolation level; from v13 topics go by id, not name.
pub(super) const FETCH: Api = Api {
    key: ApiKey::Fetch,
    name: "Fetch",
    min: 4,
    max: 12,
};

/// An open connection to one broker, with the API versions it serves.
#[derive(Debug)]
pub(super) struct Connection {
    /// The broker's `host:port`.
    broker: String,
    /// The socket.
    stream: Socket,
    /// The bound on each request.
    timeout: Duration,
    /// The correlation id of the last request sent.
    correlation_id: i32,
    /// The versions the broker serves, `(min, max)` by API key.
    served: HashMap<i16, (i16, i16)>,
}

impl Connection {
    /// Connects to `broker` (`host:port`) as `security` says and asks which API versions it
    /// serves.
    pub(super) async fn open(
        broker: &str,
        timeout: Duration,
        security: &Security,
    ) -> Result<Connection, LogError> {
        let connect = async {
            let tcp = TcpStream::connect(broker).await?;
            // Requests are small and answered before the next is sent: no batching to wait for.
            let _ = tcp.set_nodelay(true);
            match security.tls() {
                None => Ok(Socket::Plain(tcp)),
                Some(config) => {
                    let host = broker.rsplit_once(':').map_or(broker, |(host, _)| host);
                    let host = host.trim_start_matches('[').trim_end_matches(']');
                    let tls = tls::connect(config, host, tcp).await?;
                    Ok(Socket::Tls(Box::new(tls)))
                }
            }
        };
        let stream = tokio::time::timeout(timeout, connect)
            .await
            .map_err(|_| LogError::TimedOut {
                broker: broker.to_string(),
                api: "connect",
                timeout,
            })?
            .map_err(|source| LogError::Connect {
                broker: broker.to_string(),
                source,
            })?;
        let mut connection = Connection {
            broker: broker.to_string(),
            stream,
            timeout,
            correlation_id: 0,
            served: HashMap::new(),
        };
        connection.served = connection.api_versions().await?;
        if let Some(sasl) = security.sasl() {
            sasl.authenticate(&mut connection).await?;
        }
        Ok(connection)
    }

    /// The broker's address.
    pub(super) fn broker(&self) -> &str {
        &self.broker
    }

    /// Sends `request` in the highest version of `api` both sides speak and decodes the answer.
    pub(super) async fn send<R: Request>(
        &mut self,
        api: Api,
        request: &R,
    ) -> Result<R::Response, LogError> {
        let version = self.version(api)?;
        let mut body = self.round_trip(api, request, version).await?;
        R::Response::decode(&mut body, version).map_err(|error| self.protocol(api, error))
    }

    /// The highest version of `api` both this reader and the broker speak.
    fn version(&self, api: Api) -> Result<i16, LogError> {
        let served = self.served.get(&(api.key as i16)).copied();
        choose_version(served, (api.min, api.max)).ok_or_else(|| LogError::Unsupported {
            broker: self.broker.clone(),
            api: api.name,
            served: served.map_or("none".to_string(), |(min, max)| format!("{min} to {max}")),
            ours_min: api.min,
            ours_max: api.max,
        })
    }

    /// ApiVersions: asked in v3; a broker that does not serve v3 answers in v0, with the list.
    async fn api_versions(&mut self) -> Result<HashMap<i16, (i16, i16)>, LogError> {
        let api = Api {
            key: ApiKey::ApiVersions,
            name: "ApiVersions",
            min: 0,
            max: API_VERSIONS_ASKED,
        };
        let request = ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str("ddbpipe"))
            .with_client_software_version(StrBytes::from_static_str(env!("CARGO_PKG_VERSION")));
        let body = self.round_trip(api, &request, API_VERSIONS_ASKED).await?;
        let response = match ApiVersionsResponse::decode(&mut body.clone(), API_VERSIONS_ASKED) {
            Ok(response) if response.error_code != UNSUPPORTED_VERSION => response,
            _ => match ApiVersionsResponse::decode(&mut body.clone(), 0) {
                Ok(response) => response,
                // librdkafka's mock broker answers an unserved version in neither form: asked
                // again in v0, it answers in v0.
                Err(_) => {
                    let body = self.round_trip(api, &request, 0).await?;
                    ApiVersionsResponse::decode(&mut body.clone(), 0)
                        .map_err(|error| self.protocol(api, error))?
                }
            },
        };
        if let Some(error) = ResponseError::try_from_code(response.error_code) {
            return Err(LogError::Broker {
                broker: self.broker.clone(),
                api: api.name,
                scope: "the connection".to_string(),
                error,
            });
        }
        Ok(response
            .api_keys
            .iter()
            .map(|served| (served.api_key, (served.min_version, served.max_version)))
            .collect())
    }

    /// Writes one request and reads its answer's body, within the timeout.
    async fn round_trip<R: Request>(
        &mut self,
        api: Api,
        request: &R,
        version: i16,
    ) -> Result<Bytes, LogError> {
        self.correlation_id = self.correlation_id.wrapping_add(1);
        let correlation_id = self.correlation_id;
        let frame = frame(request, api.key, version, correlation_id)
            .map_err(|error| self.protocol(api, error))?;
        let timeout = self.timeout;
        let answer = tokio::time::timeout(timeout, async {
            self.stream.write_all(&frame).await?;
            let length = self.stream.read_i32().await?;
            let length = usize::try_from(length)
                .ok()
                .filter(|length| *length <= MAX_RESPONSE_BYTES)
                .ok_or_else(|| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("an answer of {length} bytes"),
                    )
                })?;
            let mut answer = vec![0; length];
            self.stream.read_exact(&mut answer).await?;
            Ok::<_, std::io::Error>(answer)
        })
        .await
        .map_err(|_| LogError::TimedOut {
            broker: self.broker.clone(),
            api: api.name,
            timeout,
        })?
        .map_err(|source| LogError::Connection {
            broker: self.broker.clone(),
            api: api.name,
            source,
        })?;
        let mut answer = Bytes::from(answer);
        let header_version = R::Response::header_version(version);
        let header = ResponseHeader::decode(&mut answer, header_version)
            .map_err(|error| self.protocol(api, error))?;
        if header.correlation_id != correlation_id {
            return Err(LogError::Protocol {
                broker: self.broker.clone(),
                api: api.name,
                what: format!(
                    "the answer's correlation id is {}, the request's {correlation_id}",
                    header.correlation_id
                ),
            });
        }
        Ok(answer)
    }

    /// A [`LogError::Protocol`] of this broker.
    fn protocol(&self, api: Api, error: impl std::fmt::Display) -> LogError {
        LogError::Protocol {
            broker: self.broker.clone(),
            api: api.name,
            what: error.to_string(),
        }
    }
}

/// The highest version in both the broker's `served` range and `ours`; `None` when they do
/// not meet (or the broker does not serve the API at all).
pub(super) fn choose_version(served: Option<(i16, i16)>, ours: (i16, i16)) -> Option<i16> {
    let (served_min, served_max) = served?;
    let version = served_max.min(ours.1);
    (version >= served_min.max(ours.0)).then_some(version)
}

/// A request as it goes on the wire: length, header, body.
fn frame<R: Request>(
    request: &R,
    key: ApiKey,
    version: i16,
    correlation_id: i32,
) -> Result<BytesMut, String> {
    let header = RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_static_str(CLIENT_ID)));
    let mut frame = BytesMut::new();
    frame.put_i32(0);
    header
        .encode(&mut frame, R::header_version(version))
        .map_err(|error| format!("the request header does not encode: {error:#}"))?;
    request
        .encode(&mut frame, version)
        .map_err(|error| format!("the request does not encode: {error:#}"))?;
    let length = i32::try_from(frame.len() - 4)
        .map_err(|_| format!("a request of {} bytes", frame.len()))?;
    frame[..4].copy_from_slice(&length.to_be_bytes());
    Ok(frame)
}
