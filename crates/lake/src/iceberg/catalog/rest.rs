//! An Iceberg REST catalog as the Iceberg sink's catalog (docs/sinks.md §7.11, `catalog`
//! rules): Apache Polaris, Snowflake's Open Catalog, Lakekeeper, Nessie, Gravitino, Unity
//! Catalog, Tabular-style services — any server of the Iceberg REST catalog API.
//!
//! # Rules
//! 1. **Routes.** The catalog's API is at `uri` (its `v1/…` routes under it, so
//!    `https://host/api/catalog` for Polaris). `GET v1/config` is asked once (with
//!    `?warehouse=` when `warehouse` is given); its `prefix` override, when it sends one, goes
//!    between `v1/` and every route, as the API says.
//! 2. **Authentication.** `token` is sent as a bearer token. `credential`
//!    (`<client_id>:<client_secret>`) is exchanged for one by OAuth 2's client-credentials
//!    grant at `oauth2_server_uri` (default `<uri>/v1/oauth/tokens`, the API's own) with
//!    `scope` (default `catalog`), again when it expires (its `expires_in`, a minute early) or
//!    when the catalog refuses a token that worked before (401). Neither secret is ever in a
//!    message, a log line or `Debug`.
//! 3. **Location**: `LoadTable`'s `metadata-location` (`None` on 404: no such table; the sink
//!    reads the metadata file itself, from its warehouse).
//! 4. **Create**: the namespace when it is not there (read first: a principal may write
//!    tables in a namespace it may not create; 409: another writer made it), then the
//!    metadata the sink wrote is registered as the table (`register`, the API's way to record
//!    a table whose metadata exists); 409 is another writer's table: `false`.
//! 5. **Commit.** A REST catalog moves a table by updates, not by a location: the sink sends
//!    the updates its metadata builder recorded (a snapshot added, a ref set or removed,
//!    snapshots expired, properties, a schema or spec added and made current) under
//!    requirements that the table is still the one the commit was built on — its uuid, the
//!    snapshot of each of `refs` (none: the ref does not exist; asserted of a table that has
//!    snapshots, or of `main`: pyiceberg's catalogs refuse any other in a table without
//!    one), its current schema, last column id, default spec and last partition id. The server applies them only then and
//!    writes the new metadata; 409 (`CommitFailedException`) is a conflict, unless the table
//!    now holds the commit's own new snapshot (an earlier attempt landed, its answer lost:
//!    the catalogs' rule 5), which no other commit adds.
//! 6. **Retries** (the catalogs' rule 4): 429 and 503 are throttles, 500, 502, 504 and a lost
//!    answer transient; other answers are final, named by the error type and message the
//!    catalog sent (a refused token by its 401 or 403, with what to check).
//! 7. **`check`** asks `v1/config` and lists the namespaces: the address, the credentials
//!    and the permission to read the catalog. Whether the principal may
//!    create and commit shows at a run's first commit: the API has no dry run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ddbpipe_source::config::Secret;
use ddbpipe_source::endpoint::mask_urls_in;
use ddbpipe_source::error::{ApiError, Contact, ErrorClass};
use ddbpipe_source::retry::RetryPolicy;
use iceberg::spec::{MAIN_BRANCH, TableMetadata};
use iceberg::{TableRequirement, TableUpdate};
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};
use serde_json::{Value, json};
use tokio::sync::{Mutex, OnceCell};

use super::Requests;
use crate::failure::Failure;

/// How long a request may take, from connecting to the end of its answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a connection may take to be made.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// `scope` when unset (rule 2): what pyiceberg and Iceberg's Java client ask.
const DEFAULT_SCOPE: &str = "catalog";

/// What a path segment may not hold unencoded (a name's `/`, `%`, `?`, `#`, space…).
const SEGMENT: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'/')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'`')
    .add(b'{')
    .add(b'}');

/// How a REST catalog is reached and who the run is to it (rule 2).
#[derive(Clone, Default)]
pub struct RestAuth {
    /// A bearer token.
    pub token: Option<Secret>,
    /// `<client_id>:<client_secret>`, exchanged for a token.
    pub credential: Option<Secret>,
    /// Where the credential is exchanged; `None`: `<uri>/v1/oauth/tokens`.
    pub oauth2_server_uri: Option<String>,
    /// The scope asked for; `None`: [`DEFAULT_SCOPE`].
    pub scope: Option<String>,
}

/// A token got for the credential, and when to get another.
#[derive(Clone)]
struct Granted {
    token: Secret,
    renew_at: Option<Instant>,
    /// A request was answered with it: a later 401 means it expired.
    worked: bool,
}

/// An Iceberg REST catalog.
#[derive(Clone)]
pub struct RestCatalog {
    http: reqwest::Client,
    /// `uri` without its trailing `/`.
    uri: String,
    /// `uri` masked, for messages.
    shown: String,
    warehouse: Option<String>,
    auth: RestAuth,
    /// Rule 1: `v1/` and the prefix, once asked.
    base: Arc<OnceCell<String>>,
    granted: Arc<Mutex<Option<Granted>>>,
    requests: Requests,
}

impl std::fmt::Debug for RestCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RestCatalog({})", self.describe())
    }
}

/// What a request was answered, when the answer is one the caller reads.
struct Answer {
    status: u16,
    body: Value,
}

impl RestCatalog {
    /// The catalog at `uri` (its `warehouse`, when the server serves several), reached as
    /// `auth` says, its requests retried within `retry`.
    pub fn new(
        uri: &str,
        warehouse: Option<String>,
        auth: RestAuth,
        retry: RetryPolicy,
    ) -> Result<RestCatalog, String> {
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .build()
            .map_err(|e| format!("cannot make an HTTP client: {}", e.without_url()))?;
        let uri = uri.trim_end_matches('/').to_string();
        if !(uri.starts_with("http://") || uri.starts_with("https://")) {
            return Err(format!(
                "{} is not an http:// or https:// URL",
                mask_urls_in(&uri)
            ));
        }
        Ok(RestCatalog {
            http,
            shown: mask_urls_in(&uri),
            uri,
            warehouse,
            auth,
            base: Arc::new(OnceCell::new()),
            granted: Arc::new(Mutex::new(None)),
            requests: Requests::new(retry, "check sink.catalog.uri"),
        })
    }

    /// The catalog for messages (never a token or credential).
    pub fn describe(&self) -> String {
        RestCatalog::describe_with(&self.shown, self.warehouse.as_deref())
    }

    /// The catalog at `uri` (masked) of `warehouse` for messages, before it is made.
    pub fn describe_with(uri: &str, warehouse: Option<&str>) -> String {
        let uri = mask_urls_in(uri);
        match warehouse {
            Some(warehouse) => format!("REST catalog {uri} (warehouse '{warehouse}')"),
            None => format!("REST catalog {uri}"),
        }
    }

    /// Rule 7.
    pub async fn writable(&self) -> Result<(), String> {
        (self.ask(
            "list_namespaces",
            "list the namespaces",
            "GET",
            "namespaces",
            None,
            &[],
        ))
        .await
        .map(drop)
        .map_err(|failure| failure.message)
    }

    /// Rule 3.
    pub(crate) async fn location(
        &self,
        namespace: &str,
        table: &str,
    ) -> Result<Option<String>, Failure> {
        Ok(self
            .load(namespace, table)
            .await?
            .map(|(location, _)| location))
    }

    /// Rule 3: the table's metadata location and metadata; `None`: no such table.
    pub(crate) async fn load(
        &self,
        namespace: &str,
        table: &str,
    ) -> Result<Option<(String, TableMetadata)>, Failure> {
        let path = table_path(namespace, table);
        let what = format!("load table {namespace}.{table}");
        let answer = self
            .ask("load_table", &what, "GET", &path, None, &[404])
            .await?;
        if answer.status == 404 {
            return Ok(None);
        }
        self.loaded(&what, answer.body).map(Some)
    }

    /// A `LoadTableResult` (or a commit's answer) read.
    fn loaded(&self, what: &str, mut body: Value) -> Result<(String, TableMetadata), Failure> {
        let unreadable = |problem: String| {
            Failure::transient(format!(
                "cannot {what} in the {}: its answer does not read: {problem}",
                self.describe()
            ))
        };
        let location = body["metadata-location"]
            .as_str()
            .ok_or_else(|| unreadable("no metadata-location".into()))?
            .to_string();
        let metadata = serde_json::from_value(body["metadata"].take())
            .map_err(|e| unreadable(format!("metadata: {e}")))?;
        Ok((location, metadata))
    }

    /// Rule 4.
    pub(crate) async fn create(
        &self,
        namespace: &str,
        table: &str,
        metadata_location: &str,
    ) -> Result<bool, Failure> {
        // Read first: a principal may write tables in a namespace it may not create.
        let path = format!("namespaces/{}", segment(namespace));
        let what = format!("read namespace {namespace}");
        let found = (self.ask("load_namespace", &what, "GET", &path, None, &[404])).await?;
        if found.status == 404 {
            let body = json!({"namespace": [namespace], "properties": {}});
            let what = format!("create namespace {namespace}");
            (self.ask(
                "create_namespace",
                &what,
                "POST",
                "namespaces",
                Some(body),
                &[409],
            ))
            .await?;
        }
        let path = format!("namespaces/{}/register", segment(namespace));
        let body = json!({"name": table, "metadata-location": metadata_location});
        let what = format!("register table {namespace}.{table}");
        let answer = (self.ask("register_table", &what, "POST", &path, Some(body), &[409])).await?;
        Ok(answer.status != 409)
    }

    /// Rule 5: `updates` committed to `namespace.table` as `base` holds it, whose `refs`
    /// are asserted; `snapshot`, the commit's new snapshot. The table's new metadata location
    /// and metadata; `None` on a conflict.
    pub(crate) async fn commit(
        &self,
        namespace: &str,
        table: &str,
        base: &TableMetadata,
        refs: &[&str],
        updates: Vec<TableUpdate>,
        snapshot: Option<i64>,
    ) -> Result<Option<(String, TableMetadata)>, Failure> {
        let mut requirements = vec![TableRequirement::UuidMatch { uuid: base.uuid() }];
        // A ref's absence is asserted only in a table with snapshots (pyiceberg's catalogs
        // refuse it otherwise): the sink's tables have one from their creation (the claim's).
        let any = base.snapshots().next().is_some();
        for name in refs {
            let snapshot_id = base.snapshot_for_ref(name).map(|s| s.snapshot_id());
            if snapshot_id.is_some() || any || *name == MAIN_BRANCH {
                requirements.push(TableRequirement::RefSnapshotIdMatch {
                    r#ref: name.to_string(),
                    snapshot_id,
                });
            }
        }
        requirements.extend([
            TableRequirement::CurrentSchemaIdMatch {
                current_schema_id: base.current_schema_id(),
            },
            TableRequirement::LastAssignedFieldIdMatch {
                last_assigned_field_id: base.last_column_id(),
            },
            TableRequirement::DefaultSpecIdMatch {
                default_spec_id: base.default_partition_spec_id(),
            },
            TableRequirement::LastAssignedPartitionIdMatch {
                last_assigned_partition_id: base.last_partition_id(),
            },
        ]);
        let body = json!({
            "identifier": {"namespace": [namespace], "name": table},
            "requirements": requirements,
            "updates": updates,
        });
        let what = format!("commit to table {namespace}.{table}");
        let path = table_path(namespace, table);
        let answer = (self.ask("commit_table", &what, "POST", &path, Some(body), &[409])).await?;
        if answer.status != 409 {
            return self.loaded(&what, answer.body).map(Some);
        }
        // Rule 5: a lost answer's retry finds its own commit there.
        let now = self.load(namespace, table).await?;
        Ok(now.filter(|(_, metadata)| {
            snapshot.is_some_and(|id| metadata.snapshot_by_id(id).is_some())
        }))
    }

    /// A request to the catalog's route `path` (under `v1/` and the prefix) by the retry
    /// layer: the answer when it succeeded or its status is one of `expected`.
    async fn ask(
        &self,
        operation: &'static str,
        what: &str,
        method: &'static str,
        path: &str,
        body: Option<Value>,
        expected: &[u16],
    ) -> Result<Answer, Failure> {
        let base = self.base().await?;
        let url = format!("{}/{base}{path}", self.uri);
        self.requests
            .call(self.describe(), operation, what, |_| {
                self.send(method, &url, body.as_ref(), expected)
            })
            .await
    }

    /// Rule 1: `v1/` and the prefix the catalog gives, asked once.
    async fn base(&self) -> Result<&str, Failure> {
        self.base
            .get_or_try_init(|| async {
                let mut url = format!("{}/v1/config", self.uri);
                if let Some(warehouse) = &self.warehouse {
                    url.push_str("?warehouse=");
                    url.extend(utf8_percent_encode(warehouse, SEGMENT));
                }
                let answer = self
                    .requests
                    .call(
                        self.describe(),
                        "get_config",
                        "read the configuration",
                        |_| self.send("GET", &url, None, &[]),
                    )
                    .await?;
                Ok(match answer.body["overrides"]["prefix"].as_str() {
                    Some(prefix) if !prefix.is_empty() => {
                        format!("v1/{}/", prefix.trim_matches('/'))
                    }
                    _ => "v1/".to_string(),
                })
            })
            .await
            .map(String::as_str)
    }

    /// One attempt of a request, authenticated (rule 2), classified (rule 6).
    async fn send(
        &self,
        method: &'static str,
        url: &str,
        body: Option<&Value>,
        expected: &[u16],
    ) -> Result<Answer, ApiError> {
        let method = reqwest::Method::from_bytes(method.as_bytes())
            .map_err(|e| ApiError::fatal(e.to_string()))?;
        let mut request = self.http.request(method, url);
        if let Some(body) = body {
            request = request.json(body);
        }
        if let Some(token) = self.token().await? {
            request = request.bearer_auth(token.expose());
        }
        let response = request.send().await.map_err(transport)?;
        let status = response.status().as_u16();
        let text = response.text().await.map_err(transport)?;
        let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if (200..300).contains(&status) || expected.contains(&status) {
            self.token_worked().await;
            return Ok(Answer { status, body });
        }
        Err(self.refused(status, &body).await)
    }

    /// Rule 6: an answer that is not one the caller reads.
    async fn refused(&self, status: u16, body: &Value) -> ApiError {
        let error = &body["error"];
        let kind = error["type"].as_str().map(str::to_string);
        let mut message = match error["message"].as_str() {
            Some(message) => format!("HTTP {status}: {message}"),
            None => format!("HTTP {status}"),
        };
        let class = match status {
            429 | 503 => ErrorClass::Throttle,
            500 | 502 | 504 => ErrorClass::Transient,
            401 => {
                // Rule 2: a granted token that worked has expired; a first one is refused.
                let mut granted = self.granted.lock().await;
                let expired = granted.as_ref().is_some_and(|g| g.worked);
                *granted = None;
                if expired {
                    ErrorClass::Transient
                } else {
                    message.push_str(
                        " (the catalog refused the run's identity: check sink.catalog.token or \
                         sink.catalog.credential)",
                    );
                    ErrorClass::Fatal
                }
            }
            403 => {
                message.push_str(" (the run's principal may not do this: grant it in the catalog)");
                ErrorClass::Fatal
            }
            _ => ErrorClass::Fatal,
        };
        ApiError {
            class,
            code: kind,
            message,
            contact: Contact::Made,
        }
    }

    /// Rule 2: the token to send, got for the credential when there is none or it expires.
    async fn token(&self) -> Result<Option<Secret>, ApiError> {
        if let Some(token) = &self.auth.token {
            return Ok(Some(token.clone()));
        }
        let Some(credential) = &self.auth.credential else {
            return Ok(None);
        };
        let mut granted = self.granted.lock().await;
        if let Some(held) = granted.as_ref()
            && held.renew_at.is_none_or(|at| Instant::now() < at)
        {
            return Ok(Some(held.token.clone()));
        }
        let (client_id, client_secret) = match credential.expose().split_once(':') {
            Some((id, secret)) => (id, secret),
            None => ("", credential.expose()),
        };
        let url = match &self.auth.oauth2_server_uri {
            Some(uri) => uri.clone(),
            None => format!("{}/v1/oauth/tokens", self.uri),
        };
        let scope = self.auth.scope.as_deref().unwrap_or(DEFAULT_SCOPE);
        let mut form = vec![
            ("grant_type", "client_credentials"),
            ("client_secret", client_secret),
            ("scope", scope),
        ];
        if !client_id.is_empty() {
            form.push(("client_id", client_id));
        }
        let response = (self.http.post(&url).form(&form).send())
            .await
            .map_err(transport)?;
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        let token = body["access_token"].as_str();
        let Some(token) = token.filter(|_| (200..300).contains(&status)) else {
            let said = body["error_description"]
                .as_str()
                .or(body["error"].as_str())
                .unwrap_or("no access_token");
            let class = match status {
                429 | 503 => ErrorClass::Throttle,
                500 | 502 | 504 => ErrorClass::Transient,
                _ => ErrorClass::Fatal,
            };
            return Err(ApiError {
                class,
                code: None,
                message: format!(
                    "the token endpoint {} answered HTTP {status}: {said} (check \
                     sink.catalog.credential and sink.catalog.scope)",
                    mask_urls_in(&url)
                ),
                contact: Contact::Made,
            });
        };
        let renew_at = body["expires_in"]
            .as_u64()
            .map(|secs| Instant::now() + Duration::from_secs(secs.saturating_sub(60).max(1)));
        let token = Secret::new(token);
        *granted = Some(Granted {
            token: token.clone(),
            renew_at,
            worked: false,
        });
        Ok(Some(token))
    }

    /// Rule 2: the granted token was answered.
    async fn token_worked(&self) {
        if self.auth.credential.is_some()
            && let Some(granted) = self.granted.lock().await.as_mut()
        {
            granted.worked = true;
        }
    }
}

/// A namespace's or table's name as one segment of a route.
fn segment(name: &str) -> String {
    utf8_percent_encode(name, SEGMENT).to_string()
}

/// The route of `namespace.table`.
fn table_path(namespace: &str, table: &str) -> String {
    format!(
        "namespaces/{}/tables/{}",
        segment(namespace),
        segment(table)
    )
}

/// A request that got no answer: whether it made a connection (docs/errors.md §9.6), what
/// failed, never its URL (which may hold credentials).
fn transport(error: reqwest::Error) -> ApiError {
    let connect = error.is_connect();
    let error = error.without_url();
    let mut message = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        message.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    let message = mask_urls_in(&message);
    if connect {
        ApiError::not_reached(message)
    } else {
        ApiError::transport(message)
    }
}
