//! Where a lake sink's files go: a local directory or a prefix of an S3 bucket, behind one set
//! of operations (put, get, list, delete), names relative to the root.
//!
//! # Rules
//! 1. A file appears whole or not at all: on S3 a `PutObject` is atomic; in a directory it is
//!    written beside its name, synced, then renamed (and the directory synced).
//! 2. [`Objects::create`] writes only a name nobody wrote: S3's conditional write
//!    (`If-None-Match: *`, answered 412 when the object exists), a hard link in a directory
//!    (which fails when the name exists). The commit log's fence (`commits` rule 3).
//! 3. Messages name the place (`s3://bucket/prefix/name`, a path) and the operation; an S3
//!    error is told as every AWS error is (`ddbpipe_source::aws::api_error`: its code and
//!    message, any URL in it masked), never a credential.
//! 4. Every S3 request goes through the run's one retry layer (`source.retry`,
//!    docs/errors.md §9): a throttle (`SlowDown`), a 5xx, a timed-out attempt or a lost answer
//!    is tried again within the budget, a listing page by page (an endpoint that took no
//!    connection yet only three times, as a run's first request: docs/errors.md §9.6); a
//!    `ConditionalRequestConflict` (two conditional writes of one name at once) too, a
//!    transient code. A
//!    conditional write whose retry finds the name taken reads the object back: the same
//!    bytes are its own earlier attempt, which landed although its answer was lost
//!    ([`Created::Written`]), other bytes another writer's ([`Created::Taken`]).

use std::future::Future;
use std::path::{Path, PathBuf};

use aws_sdk_s3::primitives::ByteStream;
use aws_smithy_runtime_api::http::Response as HttpResponse;
use bytes::Bytes;
use ddbpipe_source::aws::api_error;
use ddbpipe_source::error::{ApiError, Contact, ReadError};
use ddbpipe_source::events::RequestMetrics;
use ddbpipe_source::retry::{FirstContact, RetryPolicy};

/// A lake location as configured: `s3://bucket/prefix` or a local directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A local directory.
    Local(PathBuf),
    /// An S3 bucket and a prefix inside it (empty, or ending in `/`).
    S3 {
        /// The bucket.
        bucket: String,
        /// The prefix, without a leading `/`.
        prefix: String,
    },
}

impl Location {
    /// Reads `text`: `s3://bucket[/prefix]`, or any other text as a directory.
    pub fn parse(text: &str) -> Result<Location, String> {
        let Some(rest) = text.strip_prefix("s3://") else {
            if text.contains("://") {
                return Err(format!(
                    "'{text}' is neither an s3:// URL nor a local directory (only s3:// is read)"
                ));
            }
            if text.is_empty() {
                return Err("the location is empty".into());
            }
            return Ok(Location::Local(PathBuf::from(text)));
        };
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(format!("'{text}' names no bucket (s3://bucket/prefix/)"));
        }
        let prefix = prefix.trim_matches('/');
        Ok(Location::S3 {
            bucket: bucket.to_string(),
            prefix: if prefix.is_empty() {
                String::new()
            } else {
                format!("{prefix}/")
            },
        })
    }

    /// The location for messages.
    pub fn describe(&self) -> String {
        match self {
            Location::Local(path) => path.display().to_string(),
            Location::S3 { bucket, prefix } => format!("s3://{bucket}/{prefix}"),
        }
    }
}

/// The files under a lake location.
#[derive(Clone)]
pub enum Objects {
    /// A local directory.
    Local(PathBuf),
    /// A prefix of an S3 bucket.
    S3 {
        /// The client (credentials from the AWS chain, the endpoint path-style when given).
        client: aws_sdk_s3::Client,
        /// The bucket.
        bucket: String,
        /// The prefix (empty, or ending in `/`).
        prefix: String,
        /// The endpoint when one is configured, masked (for messages).
        endpoint: Option<String>,
        /// The run's retry budget (rule 4).
        retry: RetryPolicy,
        /// Whether S3 answered yet (rule 4).
        contact: FirstContact,
    },
}

impl std::fmt::Debug for Objects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Objects({})", self.describe())
    }
}

/// What [`Objects::create`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Created {
    /// The file was written.
    Written,
    /// The name was taken already: nothing was written.
    Taken,
}

impl Objects {
    /// The files of `location`; `client` builds the S3 client when it is on S3, whose
    /// configured endpoint, `endpoint`, is given masked (for messages), and whose requests are
    /// retried within `retry` (rule 4).
    pub fn new(
        location: &Location,
        endpoint: Option<String>,
        retry: RetryPolicy,
        client: impl FnOnce() -> aws_sdk_s3::Client,
    ) -> Objects {
        match location {
            Location::Local(path) => Objects::Local(path.clone()),
            Location::S3 { bucket, prefix } => Objects::S3 {
                client: client(),
                bucket: bucket.clone(),
                prefix: prefix.clone(),
                endpoint,
                retry,
                contact: FirstContact::default(),
            },
        }
    }

    /// The root for messages.
    pub fn describe(&self) -> String {
        match self {
            Objects::Local(path) => path.display().to_string(),
            Objects::S3 { bucket, prefix, .. } => format!("s3://{bucket}/{prefix}"),
        }
    }

    /// `name` for messages.
    pub fn name(&self, name: &str) -> String {
        match self {
            Objects::Local(path) => path.join(name).display().to_string(),
            Objects::S3 { bucket, prefix, .. } => format!("s3://{bucket}/{prefix}{name}"),
        }
    }

    /// Writes `bytes` as `name`, replacing it (rule 1).
    pub async fn put(&self, name: &str, bytes: Vec<u8>) -> Result<(), String> {
        self.write(name, bytes, false).await.map(|_| ())
    }

    /// Writes `bytes` as `name` only when no file of that name exists (rule 2).
    pub async fn create(&self, name: &str, bytes: Vec<u8>) -> Result<Created, String> {
        self.write(name, bytes, true).await
    }

    /// Rule 1, and rule 2 when `exclusive`.
    async fn write(&self, name: &str, bytes: Vec<u8>, exclusive: bool) -> Result<Created, String> {
        match self {
            Objects::Local(root) => {
                let path = root.join(name);
                blocking(move || write_local(&path, &bytes, exclusive))
                    .await
                    .map_err(|e| format!("cannot write {}: {e}", self.name(name)))
            }
            Objects::S3 {
                client,
                bucket,
                prefix,
                ..
            } => {
                let key = format!("{prefix}{name}");
                let bytes = Bytes::from(bytes);
                self.s3_call("put_object", "write", name, |n| {
                    let (key, bytes) = (&key, &bytes);
                    async move {
                        let sent = (client.put_object())
                            .bucket(bucket)
                            .key(key)
                            .set_if_none_match(exclusive.then(|| "*".to_string()))
                            .body(ByteStream::from(bytes.clone()))
                            .send()
                            .await;
                        match sent {
                            Ok(_) => Ok(Created::Written),
                            Err(error) if exclusive && status(&error) == Some(412) => {
                                // Rule 4: taken by an earlier attempt of this write, or by
                                // another writer.
                                let ours = n > 0 && self.s3_get(key).await?.as_ref() == Some(bytes);
                                Ok(if ours {
                                    Created::Written
                                } else {
                                    Created::Taken
                                })
                            }
                            Err(error) => Err(api_error(error)),
                        }
                    }
                })
                .await
            }
        }
    }

    /// The file `name`; `None` when there is none.
    pub async fn get(&self, name: &str) -> Result<Option<Vec<u8>>, String> {
        match self {
            Objects::Local(root) => match tokio::fs::read(root.join(name)).await {
                Ok(bytes) => Ok(Some(bytes)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(format!("cannot read {}: {e}", self.name(name))),
            },
            Objects::S3 { prefix, .. } => {
                let key = format!("{prefix}{name}");
                let got = self.s3_call("get_object", "read", name, |_| self.s3_get(&key));
                Ok(got.await?.map(Vec::from))
            }
        }
    }

    /// One attempt at the object `key`'s bytes (`None`: there is none), its body read whole.
    async fn s3_get(&self, key: &str) -> Result<Option<Bytes>, ApiError> {
        let Objects::S3 { client, bucket, .. } = self else {
            unreachable!("an S3 call of a directory");
        };
        let got = client.get_object().bucket(bucket).key(key).send().await;
        let out = match got {
            Ok(out) => out,
            Err(error) if status(&error) == Some(404) => return Ok(None),
            Err(error) => return Err(api_error(error)),
        };
        let body = (out.body.collect().await)
            .map_err(|e| ApiError::transport(format!("reading the object's body failed: {e}")))?;
        Ok(Some(body.into_bytes()))
    }

    /// Every file whose name starts with `under`, by name, in no particular order.
    pub async fn list(&self, under: &str) -> Result<Vec<String>, String> {
        match self {
            Objects::Local(root) => {
                let root = root.clone();
                let under = under.to_string();
                blocking(move || {
                    let mut names = Vec::new();
                    walk(&root, &root, &mut names)?;
                    names.retain(|name| name.starts_with(&under));
                    Ok(names)
                })
                .await
                .map_err(|e| format!("cannot list {}: {e}", self.describe()))
            }
            Objects::S3 {
                client,
                bucket,
                prefix,
                ..
            } => {
                let mut names = Vec::new();
                let mut token: Option<String> = None;
                loop {
                    let page = self
                        .s3_call("list_objects_v2", "list", under, |_| {
                            let listed = (client.list_objects_v2())
                                .bucket(bucket)
                                .prefix(format!("{prefix}{under}"))
                                .set_continuation_token(token.clone())
                                .send();
                            async { listed.await.map_err(api_error) }
                        })
                        .await?;
                    for object in page.contents() {
                        if let Some(key) =
                            object.key().and_then(|k| k.strip_prefix(prefix.as_str()))
                        {
                            names.push(key.to_string());
                        }
                    }
                    token = page.next_continuation_token().map(str::to_string);
                    if token.is_none() {
                        return Ok(names);
                    }
                }
            }
        }
    }

    /// Whether files can be written and deleted here (`check`): writes a small file under
    /// `_ddbpipe/`, then deletes it.
    pub async fn probe(&self) -> Result<(), String> {
        let name = format!(
            "_ddbpipe/check-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        );
        self.put(&name, b"ddbpipe check".to_vec()).await?;
        self.delete(&name).await
    }

    /// Deletes `name` (nothing when there is none).
    pub async fn delete(&self, name: &str) -> Result<(), String> {
        match self {
            Objects::Local(root) => match tokio::fs::remove_file(root.join(name)).await {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(format!("cannot delete {}: {e}", self.name(name))),
            },
            Objects::S3 {
                client,
                bucket,
                prefix,
                ..
            } => {
                let key = format!("{prefix}{name}");
                self.s3_call("delete_object", "delete", name, |_| async {
                    let deleted = client.delete_object().bucket(bucket).key(&key).send().await;
                    deleted.map(|_| ()).map_err(api_error)
                })
                .await
            }
        }
    }
}

impl Objects {
    /// Rule 4: an S3 request (`operation`, each attempt made by `attempt`) through the run's
    /// retry layer, the last failure told as rule 3 says (`cannot <verb> <name>`).
    async fn s3_call<T, F, Fut>(
        &self,
        operation: &'static str,
        verb: &str,
        name: &str,
        attempt: F,
    ) -> Result<T, String>
    where
        F: FnMut(u32) -> Fut,
        Fut: Future<Output = Result<T, ApiError>>,
    {
        let Objects::S3 { retry, contact, .. } = self else {
            unreachable!("an S3 call of a directory");
        };
        let what = || self.name(name);
        (contact.run((retry, &RequestMetrics), operation, what, attempt))
            .await
            .map_err(|failed| match failed {
                ReadError::Request {
                    error, attempts, ..
                } => self.s3_failed(verb, name, &error, attempts),
                other => format!("cannot {verb} {}: {other}", self.name(name)),
            })
    }

    /// An S3 call that failed after `attempts`, as every AWS error is told (rule 3): `cannot
    /// <verb> <name>:` its code and message; when no connection was made, the endpoint too,
    /// masked.
    fn s3_failed(&self, verb: &str, name: &str, error: &ApiError, attempts: u32) -> String {
        let mut message = format!("cannot {verb} {}", self.name(name));
        if attempts > 1 {
            message.push_str(&format!(" ({attempts} attempts)"));
        }
        message.push_str(&format!(": {error}"));
        if error.contact == Contact::NotMade
            && let Objects::S3 { endpoint, .. } = self
        {
            let endpoint = endpoint.as_ref().map_or_else(
                || "AWS's S3 endpoint".to_string(),
                |url| format!("the S3 endpoint {url}"),
            );
            message.push_str(&format!(
                " ({endpoint} could not be reached: check sink.s3_endpoint_url and sink.s3_region)"
            ));
        }
        message
    }
}

/// The HTTP status an S3 call was answered with, when it was answered.
fn status<E>(error: &aws_sdk_s3::error::SdkError<E, HttpResponse>) -> Option<u16> {
    error.raw_response().map(|r| r.status().as_u16())
}

/// Rule 1 (and rule 2 with `exclusive`): writes beside `path`, syncs, then renames over it (or
/// links it, failing when it exists).
fn write_local(path: &Path, bytes: &[u8], exclusive: bool) -> std::io::Result<Created> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let temporary = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    {
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(bytes)?;
        file.sync_all()?;
    }
    let created = if exclusive {
        let linked = std::fs::hard_link(&temporary, path);
        std::fs::remove_file(&temporary)?;
        match linked {
            Ok(()) => Created::Written,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(Created::Taken),
            Err(e) => return Err(e),
        }
    } else {
        std::fs::rename(&temporary, path)?;
        Created::Written
    };
    std::fs::File::open(dir)?.sync_all()?;
    Ok(created)
}

/// The files under `dir`, named relative to `root` with `/` between parts; temporary files of
/// rule 1 are left out.
pub(crate) fn walk(root: &Path, dir: &Path, names: &mut Vec<String>) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            walk(root, &path, names)?;
        } else if let Ok(relative) = path.strip_prefix(root) {
            let name = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy())
                .collect::<Vec<_>>()
                .join("/");
            if !name.rsplit('/').next().is_some_and(|n| n.starts_with('.')) {
                names.push(name);
            }
        }
    }
    Ok(())
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(format!("file task failed: {e}"))))
}

#[cfg(test)]
mod tests;
