//! The Iceberg sink's catalogs (docs/sinks.md §7.11): where a table's current metadata
//! location is kept, read and swapped. Three kinds: a SQL catalog (`sql`: Iceberg's JDBC catalog
//! and pyiceberg's `SqlCatalog`, in SQLite or PostgreSQL), the AWS Glue Data Catalog
//! (`glue`: what Athena, EMR, Redshift Spectrum and pyiceberg's `GlueCatalog` read), an
//! Amazon S3 table bucket (`s3tables`: its tables, whose files the service places) and an
//! Iceberg REST catalog (`rest`: Polaris, Lakekeeper, Nessie, Unity Catalog…).
//!
//! # Rules
//! 1. A catalog answers four calls, the same for all: the table's metadata location (`None`:
//!    no such table), a new table recorded (`false`: another writer recorded it first), a
//!    commit's swap from the location it was built on to the new one (`false`: a conflict,
//!    the table read again and the commit built again), and `check`'s probe. A REST catalog
//!    commits by updates instead of a swap ([`RestCatalog::commit`]; the sink's table rule 5).
//! 2. A swap happens only while the catalog still holds the location the commit was built
//!    on, atomically: SQL by `UPDATE … WHERE metadata_location = old`, Glue by `UpdateTable`
//!    with the `VersionId` the location was read under (Glue refuses it when the table changed
//!    since: `ConcurrentModificationException`), S3 Tables by `UpdateTableMetadataLocation`
//!    under the version token the location was read with (`ConflictException`).
//! 3. Where a table's files are: SQL and Glue tables at `<warehouse>/<namespace>.db/<table>`
//!    ([`Catalog::table_dir`]); an S3 table at the location the service gives it (its
//!    warehouse, [`S3TablesCatalog::place`]), as Iceberg's and pyiceberg's S3 Tables catalogs
//!    place it.
//! 4. Every request to an AWS or REST catalog goes through the run's one retry layer
//!    (`source.retry`, docs/errors.md §9, [`Requests`]): throttles, 5xx, timed-out attempts and
//!    lost answers are tried again within its budget (an endpoint that took no connection yet
//!    only three times, as a run's first request: §9.6).
//! 5. A recording or swap answered "another writer was first" is read back: a catalog holding
//!    this commit's own metadata location — a name only this commit writes — took it (an
//!    earlier attempt landed although its answer was lost, and its retry found the change).
//! 6. A request the catalog refused for good (a fatal answer: a refused credential, a missing
//!    grant, a request it does not take) fails the run as definite: a rerun meets the same
//!    answer until its cause is fixed, and the run's hint says so instead of promising that a
//!    rerun resumes. What ran out of retries (throttles, 5xx, no connection) stays transient.

mod glue;
mod rest;
mod s3tables;
mod sql;

use std::future::Future;

use ddbpipe_source::error::{ApiError, Contact, ErrorClass, ReadError};
use ddbpipe_source::events::RequestMetrics;
use ddbpipe_source::retry::{FirstContact, RetryPolicy};
use iceberg::spec::Schema;

use crate::failure::Failure;

/// What to check when an AWS catalog could not be reached.
const AWS_UNREACHED: &str = "check sink.catalog.region and sink.catalog.endpoint_url";

/// Rule 4: how an AWS or REST catalog's requests are made: within the run's retry budget, and
/// whether the service answered yet (docs/errors.md §9.6).
#[derive(Debug, Clone)]
struct Requests {
    retry: RetryPolicy,
    contact: FirstContact,
    /// What to check when the catalog could not be reached.
    unreached: &'static str,
}

impl Requests {
    fn new(retry: RetryPolicy, unreached: &'static str) -> Requests {
        Requests {
            retry,
            contact: FirstContact::default(),
            unreached,
        }
    }

    /// A request to `catalog` (for messages) to `what` (`operation` in the retry log), each
    /// attempt made by `attempt`: `Ok` with what the caller reads (an answer it expects, such
    /// as "no such table", included), `Err` with the attempt's failure.
    async fn call<T, F, Fut>(
        &self,
        catalog: String,
        operation: &'static str,
        what: &str,
        attempt: F,
    ) -> Result<T, Failure>
    where
        F: FnMut(u32) -> Fut,
        Fut: Future<Output = Result<T, ApiError>>,
    {
        let described = || format!("{what} in the {catalog}");
        let called = (self.contact).run(
            (&self.retry, &RequestMetrics),
            operation,
            described,
            attempt,
        );
        called.await.map_err(|failed| match failed {
            ReadError::Request {
                error, attempts, ..
            } => self.failure(&catalog, what, error, attempts),
            other => Failure::transient(format!("cannot {what} in the {catalog}: {other}")),
        })
    }

    /// A call that failed after `attempts`, `catalog` for messages: its code and message;
    /// when no connection was made, what to check; definite when refused for good (rule 6).
    fn failure(&self, catalog: &str, what: &str, error: ApiError, attempts: u32) -> Failure {
        let tries = match attempts {
            0 | 1 => String::new(),
            n => format!(" ({n} attempts)"),
        };
        let mut message = format!("cannot {what} in the {catalog}{tries}: {error}");
        if error.contact == Contact::NotMade {
            let unreached = self.unreached;
            message.push_str(&format!(
                " (the endpoint could not be reached: {unreached})"
            ));
        }
        match error.class {
            ErrorClass::Fatal => Failure::definite(message),
            ErrorClass::Throttle | ErrorClass::Transient => Failure::transient(message),
        }
    }
}

pub use glue::{GlueCatalog, glue_name};
pub use rest::{RestAuth, RestCatalog};
pub use s3tables::{S3TablesCatalog, s3tables_name, s3tables_name_problem, table_bucket_region};
pub use sql::SqlCatalog;

/// An Iceberg sink's catalog.
#[derive(Debug, Clone)]
pub enum Catalog {
    /// A SQL catalog.
    Sql(SqlCatalog),
    /// The Glue Data Catalog.
    Glue(GlueCatalog),
    /// An S3 table bucket.
    S3Tables(S3TablesCatalog),
    /// An Iceberg REST catalog.
    Rest(RestCatalog),
}

impl Catalog {
    /// The catalog for messages (never a password).
    pub fn describe(&self) -> String {
        match self {
            Catalog::Sql(catalog) => catalog.describe(),
            Catalog::Glue(catalog) => catalog.describe(),
            Catalog::S3Tables(catalog) => catalog.describe(),
            Catalog::Rest(catalog) => catalog.describe(),
        }
    }

    /// Rule 3: the directory of `namespace.table` in its warehouse (ending in `/`; `` for the
    /// warehouse itself).
    pub fn table_dir(&self, namespace: &str, table: &str) -> String {
        match self {
            Catalog::Sql(_) | Catalog::Glue(_) | Catalog::Rest(_) => {
                format!("{namespace}.db/{table}/")
            }
            Catalog::S3Tables(_) => String::new(),
        }
    }

    /// `check`'s probe (rule 1), found without changing the catalog.
    pub async fn writable(&self) -> Result<(), String> {
        match self {
            Catalog::Sql(catalog) => catalog.writable().await,
            Catalog::Glue(catalog) => catalog.writable().await,
            Catalog::S3Tables(catalog) => catalog.writable().await,
            Catalog::Rest(catalog) => catalog.writable().await,
        }
    }

    /// The current metadata location of `namespace.table`; `None` when the catalog has no
    /// such table.
    /// A failure is transient unless the table cannot be this sink's (a Glue table not
    /// Iceberg's).
    pub(crate) async fn location(
        &self,
        namespace: &str,
        table: &str,
    ) -> Result<Option<String>, Failure> {
        match self {
            Catalog::Sql(catalog) => {
                (catalog.location(namespace, table).await).map_err(Failure::transient)
            }
            Catalog::Glue(catalog) => catalog.location(namespace, table).await,
            Catalog::S3Tables(catalog) => catalog.location(namespace, table).await,
            Catalog::Rest(catalog) => catalog.location(namespace, table).await,
        }
    }

    /// Records a new table (and its namespace) at `metadata_location`, whose current schema
    /// is `schema` (Glue lists its columns); `false` when another writer recorded it first.
    pub(crate) async fn create(
        &self,
        namespace: &str,
        table: &str,
        metadata_location: &str,
        schema: &Schema,
    ) -> Result<bool, Failure> {
        let created = match self {
            Catalog::Sql(catalog) => (catalog.create(namespace, table, metadata_location).await)
                .map_err(Failure::transient),
            Catalog::Glue(catalog) => {
                (catalog.create(namespace, table, metadata_location, schema)).await
            }
            Catalog::S3Tables(catalog) => catalog.create(namespace, table, metadata_location).await,
            Catalog::Rest(catalog) => catalog.create(namespace, table, metadata_location).await,
        };
        self.settled(namespace, table, metadata_location, created?)
            .await
    }

    /// Rule 5: `done`, or, when the catalog answered that another writer was first, whether
    /// it holds `location`, this commit's own.
    async fn settled(
        &self,
        namespace: &str,
        table: &str,
        location: &str,
        done: bool,
    ) -> Result<bool, Failure> {
        if done {
            return Ok(true);
        }
        let held = self.location(namespace, table).await?;
        Ok(held.as_deref() == Some(location))
    }

    /// Rule 2: moves `namespace.table` from metadata `old` to `new`, whose current schema is
    /// `schema`; `false` on a conflict.
    pub(crate) async fn swap(
        &self,
        namespace: &str,
        table: &str,
        old: &str,
        new: &str,
        schema: &Schema,
    ) -> Result<bool, Failure> {
        let swapped = match self {
            Catalog::Sql(catalog) => {
                (catalog.swap(namespace, table, old, new).await).map_err(Failure::transient)
            }
            Catalog::Glue(catalog) => catalog.swap(namespace, table, old, new, schema).await,
            Catalog::S3Tables(catalog) => catalog.swap(namespace, table, old, new).await,
            // A REST catalog commits by updates (`IcebergTable::swap`), never by a location.
            Catalog::Rest(catalog) => Err(Failure::definite(format!(
                "internal error: the {} was asked to swap a metadata location",
                catalog.describe()
            ))),
        };
        self.settled(namespace, table, new, swapped?).await
    }
}

impl From<SqlCatalog> for Catalog {
    fn from(catalog: SqlCatalog) -> Self {
        Catalog::Sql(catalog)
    }
}

impl From<GlueCatalog> for Catalog {
    fn from(catalog: GlueCatalog) -> Self {
        Catalog::Glue(catalog)
    }
}

impl From<RestCatalog> for Catalog {
    fn from(catalog: RestCatalog) -> Self {
        Catalog::Rest(catalog)
    }
}

impl From<S3TablesCatalog> for Catalog {
    fn from(catalog: S3TablesCatalog) -> Self {
        Catalog::S3Tables(catalog)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ddbpipe_pipeline::sink::SinkErrorClass;
    use ddbpipe_source::error::{ApiError, Contact, ErrorClass};
    use ddbpipe_source::retry::RetryPolicy;

    use super::Requests;

    /// Rule 6: a request refused for good fails the run as definite (a rerun meets the same
    /// answer); one that ran out of retries stays transient.
    #[tokio::test]
    async fn a_request_refused_for_good_is_definite_and_one_out_of_retries_transient() {
        let retry = RetryPolicy {
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(2),
            ..RetryPolicy::default()
        };
        let requests = Requests::new(retry, "check sink.catalog.uri");
        let answers = [
            (ErrorClass::Fatal, SinkErrorClass::Definite),
            (ErrorClass::Transient, SinkErrorClass::Transient),
            (ErrorClass::Throttle, SinkErrorClass::Transient),
        ];
        for (class, expected) in answers {
            let failed = requests
                .call(
                    "REST catalog".into(),
                    "load_table",
                    "load table a.b",
                    |_| {
                        std::future::ready(Err::<(), _>(ApiError {
                            class,
                            code: None,
                            message: "HTTP 403: no".into(),
                            contact: Contact::Made,
                        }))
                    },
                )
                .await
                .unwrap_err();
            assert_eq!(failed.class, expected, "{class:?}: {}", failed.message);
        }
    }
}
