//! The parquet sink's section: `{type: parquet, path, s3_region, s3_endpoint_url,
//! target_file_mb, commit_interval_secs, compression, columns, on_type_mismatch, partition_by}`
//! (docs/sinks.md §7.10; the typed columns as the keyed sinks', §7.9).

use std::collections::BTreeMap;
use std::path::Path;

use ddbpipe_keyed::OnMismatch;
use ddbpipe_lake::iceberg::{SqlCatalog, s3tables_name_problem, table_bucket_region};
use ddbpipe_lake::objects::Location;
use ddbpipe_lake::parquet::FileCompression;
use ddbpipe_lake::partition::Term;
use ddbpipe_source::config::{ConfigError, Secret};
use ddbpipe_source::endpoint::EndpointUrl;
use serde_json::json;

use super::stored_name;
use crate::sinks::keyed::columns::{
    self, COLUMNS, ColumnConfig, DEFAULT_DOCUMENT_COLUMN, Dialect, ON_TYPE_MISMATCH,
};
use crate::yaml::fields::{Fields, convert};
use crate::yaml::schema::{Field, Shape, defaulted, of, optional, required};
use crate::yaml::types::{Choice, FromYaml};

/// `sink.target_file_mb` when unset.
pub const DEFAULT_TARGET_FILE_MB: u32 = 128;
/// `sink.commit_interval_secs` when unset.
pub const DEFAULT_COMMIT_INTERVAL_SECS: u32 = 60;

/// `s3_region` of an S3 location (`source.snapshot`, the parquet sink).
pub(crate) const S3_REGION: Field = optional(
    "s3_region",
    of::<String>(),
    "The bucket's region; unset: the source's region.",
);

/// `s3_endpoint_url` of an S3 location (`source.snapshot`, the parquet sink); a secret's
/// place (`crate::yaml::fields`).
pub(crate) const S3_ENDPOINT_URL: Field = optional(
    "s3_endpoint_url",
    of::<EndpointUrl>(),
    "An S3 endpoint, addressed path-style; unset: source.endpoint_url when set.",
);

/// The keys of the parquet sink.
pub(crate) static FIELDS: &[Field] = &[
    required(
        "path",
        of::<String>(),
        "Where the files go: s3://bucket/prefix/ or a local directory; {table} and {pipeline} \
         are filled in.",
    ),
    S3_REGION,
    S3_ENDPOINT_URL,
    TARGET_FILE_MB,
    COMMIT_INTERVAL_SECS,
    COMPRESSION,
    COLUMNS,
    ON_TYPE_MISMATCH,
    PARTITION_BY,
];

/// The keys of the iceberg sink: the parquet sink's, but `path`, and where its table is.
pub(crate) static ICEBERG_FIELDS: &[Field] = &[
    required(
        "catalog",
        Shape::Section(CATALOG),
        "The catalog the table is in: {type: sql, uri: sqlite:////path/catalog.db, name}, \
         {type: glue} (the AWS Glue Data Catalog; catalog_id, region, endpoint_url), \
         {type: s3tables, table_bucket_arn} (an Amazon S3 table bucket; region, endpoint_url), \
         or {type: rest, uri: https://host/api/catalog} (an Iceberg REST catalog; warehouse, \
         token or credential, oauth2_server_uri, scope).",
    ),
    optional(
        "warehouse",
        of::<String>(),
        "sql, glue and rest (required): where the table's files go, s3://bucket/prefix or a \
         local directory; a new table is <warehouse>/<namespace>.db/<table>. s3tables: none, \
         the service gives each table its own storage.",
    ),
    defaulted(
        "namespace",
        of::<String>(),
        || json!(DEFAULT_NAMESPACE),
        "The table's namespace in the catalog.",
    ),
    defaulted(
        "table",
        of::<String>(),
        || json!("{table}"),
        "The table's name; {table} is the DynamoDB table's name.",
    ),
    optional(
        "table_properties",
        Shape::Map(<String as FromYaml>::schema),
        "Iceberg table properties (quoted strings) a run sets when it creates or claims the \
         table: history.expire.max-snapshot-age-ms, commit.manifest.min-count-to-merge, ...",
    ),
    S3_REGION,
    S3_ENDPOINT_URL,
    TARGET_FILE_MB,
    COMMIT_INTERVAL_SECS,
    COMPRESSION,
    COLUMNS,
    ON_TYPE_MISMATCH,
    PARTITION_BY,
];

/// `sink.namespace` of the iceberg sink when unset.
pub const DEFAULT_NAMESPACE: &str = "dynamodb";
/// `sink.catalog.name` when unset.
pub const DEFAULT_CATALOG_NAME: &str = "ddbpipe";

/// The keys of `sink.catalog`.
static CATALOG: &[Field] = &[
    required(
        "type",
        of::<CatalogType>(),
        "sql: the tables of Iceberg's JDBC catalog and pyiceberg's SqlCatalog, in a SQLite file \
         or a PostgreSQL database; glue: the AWS Glue Data Catalog (namespace = Glue database), \
         what Athena, EMR and pyiceberg's GlueCatalog read, with the run's AWS credentials; \
         s3tables: an Amazon S3 table bucket (namespace and table as S3 Tables keeps them), with \
         the run's AWS credentials; rest: an Iceberg REST catalog (Polaris, Lakekeeper, Nessie, \
         Unity Catalog…).",
    ),
    optional(
        "uri",
        of::<Secret>(),
        "sql: sqlite:////absolute/path/catalog.db (four slashes; a relative path after three is \
         the pipeline file's), or a postgres:// URL as the postgres sink takes it (the password \
         is never printed); the file and the catalog tables are created when missing. rest: \
         the catalog's http(s) URL, its v1/ routes under it.",
    ),
    optional(
        "warehouse",
        of::<String>(),
        "rest: the warehouse the catalog serves the table from, as the server names it (sent \
         to its v1/config); unset: the server's default.",
    ),
    optional(
        "token",
        of::<Secret>(),
        "rest: a bearer token sent with every request (never printed; ${ENV} reads it from the \
         environment).",
    ),
    optional(
        "credential",
        of::<Secret>(),
        "rest: <client_id>:<client_secret>, exchanged for tokens by OAuth 2's client \
         credentials grant (never printed).",
    ),
    optional(
        "oauth2_server_uri",
        of::<EndpointUrl>(),
        "rest: where the credential is exchanged; unset: <uri>/v1/oauth/tokens.",
    ),
    optional(
        "scope",
        of::<String>(),
        "rest: the scope the credential's tokens are asked for; unset: catalog.",
    ),
    defaulted(
        "name",
        of::<String>(),
        || json!(DEFAULT_CATALOG_NAME),
        "sql: the catalog name its rows are written under (readers must give the same).",
    ),
    optional(
        "catalog_id",
        of::<String>(),
        "glue: the account id of the Glue catalog (another account's, shared to this one); \
         unset: the caller's account.",
    ),
    optional(
        "table_bucket_arn",
        of::<String>(),
        "s3tables (required): the table bucket's ARN, \
         arn:aws:s3tables:<region>:<account>:bucket/<name>.",
    ),
    optional(
        "region",
        of::<String>(),
        "glue: the catalog's region; unset: sink.s3_region, else the run's region. s3tables: \
         unset, the region of table_bucket_arn.",
    ),
    optional(
        "endpoint_url",
        of::<EndpointUrl>(),
        "glue, s3tables: the service's endpoint; unset: source.endpoint_url when set (an \
         emulator serving all), else AWS's.",
    ),
];

/// `sink.catalog.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CatalogType {
    /// A SQL catalog in a SQLite file or a PostgreSQL database.
    Sql,
    /// The AWS Glue Data Catalog.
    Glue,
    /// An Amazon S3 table bucket.
    S3Tables,
    /// An Iceberg REST catalog.
    Rest,
}

impl Choice for CatalogType {
    fn all() -> &'static [Self] {
        &[
            CatalogType::Sql,
            CatalogType::Glue,
            CatalogType::S3Tables,
            CatalogType::Rest,
        ]
    }
    fn name(self) -> &'static str {
        match self {
            CatalogType::Sql => "sql",
            CatalogType::Glue => "glue",
            CatalogType::S3Tables => "s3tables",
            CatalogType::Rest => "rest",
        }
    }
    fn hint(found: &str) -> Option<&'static str> {
        match found {
            "s3_tables" | "s3-tables" => Some("an S3 table bucket is type: s3tables"),
            "jdbc" => Some("Iceberg's JDBC catalog is type: sql"),
            "polaris" | "nessie" | "lakekeeper" | "unity" | "gravitino" | "tabular" => {
                Some("this catalog is reached by its Iceberg REST API: type: rest, uri: …")
            }
            "hive" => Some(
                "a Hive metastore is not supported: the SQL catalog (type: sql), the AWS Glue \
                 Data Catalog (type: glue), S3 table buckets (type: s3tables) and REST catalogs \
                 (type: rest) are",
            ),
            _ => None,
        }
    }
}

/// Reads `sink.catalog` into `iceberg`: each type's keys, the other type's refused.
fn read_catalog(catalog: &mut Fields<'_>, iceberg: &mut IcebergConfig) {
    let kind = catalog.required::<CatalogType>("type");
    iceberg.catalog_type = kind.unwrap_or(CatalogType::Sql);
    match kind {
        Some(CatalogType::Sql) => {
            match catalog.get::<Secret>("uri") {
                Some(uri) => iceberg.catalog_uri = uri,
                None => catalog.missing("uri"),
            }
            iceberg.catalog_name = catalog.or("name", DEFAULT_CATALOG_NAME.to_string());
            for key in ["catalog_id", "region", "endpoint_url", "table_bucket_arn"] {
                catalog.refuse(
                    key,
                    "a key of the AWS catalogs (glue, s3tables): a sql catalog has none",
                );
            }
            refuse_rest_keys(catalog, "sql");
        }
        Some(CatalogType::Rest) => {
            match catalog.get::<Secret>("uri") {
                Some(uri) => iceberg.catalog_uri = uri,
                None => catalog.missing("uri"),
            }
            catalog.refuse(
                "name",
                "a REST catalog has no name: it is the server at uri (warehouse, when it \
                 serves several)",
            );
            for key in ["catalog_id", "region", "endpoint_url", "table_bucket_arn"] {
                catalog.refuse(
                    key,
                    "a key of the AWS catalogs (glue, s3tables): a REST catalog is reached at \
                     uri",
                );
            }
            let token = catalog.get("token");
            if token.is_some() {
                catalog.refuse(
                    "credential",
                    "give token or credential, not both: a credential is exchanged for a token",
                );
            }
            iceberg.rest = RestConfig {
                warehouse: catalog.get("warehouse"),
                credential: token.is_none().then(|| catalog.get("credential")).flatten(),
                token,
                oauth2_server_uri: catalog.get("oauth2_server_uri"),
                scope: catalog.get("scope"),
            };
        }
        Some(CatalogType::Glue) => {
            catalog.refuse(
                "uri",
                "a glue catalog has no uri: it is the account's (catalog_id), reached with the \
                 run's AWS credentials in region (endpoint_url for an emulator)",
            );
            catalog.refuse(
                "name",
                "a glue catalog has no name: readers name it as they like (pyiceberg's \
                 GlueCatalog, Athena's AwsDataCatalog)",
            );
            catalog.refuse(
                "table_bucket_arn",
                "an s3tables catalog's key: a glue catalog is the account's (catalog_id)",
            );
            iceberg.catalog_id = catalog.get("catalog_id");
            iceberg.catalog_region = catalog.get("region");
            iceberg.catalog_endpoint_url = catalog.get("endpoint_url");
            refuse_rest_keys(catalog, "glue");
        }
        Some(CatalogType::S3Tables) => {
            for (key, why) in [
                (
                    "uri",
                    "an s3tables catalog has no uri: it is table_bucket_arn",
                ),
                (
                    "name",
                    "an s3tables catalog has no name: readers name it as they like",
                ),
                (
                    "catalog_id",
                    "an s3tables catalog is its table bucket's (table_bucket_arn)",
                ),
            ] {
                catalog.refuse(key, why);
            }
            iceberg.table_bucket_arn = catalog.get("table_bucket_arn");
            if iceberg.table_bucket_arn.is_none() {
                catalog.missing("table_bucket_arn");
            }
            iceberg.catalog_region = catalog.get("region");
            iceberg.catalog_endpoint_url = catalog.get("endpoint_url");
            refuse_rest_keys(catalog, "s3tables");
        }
        // The type's error is reported: the other keys are not judged.
        None => {
            let keys = [
                "uri",
                "name",
                "catalog_id",
                "table_bucket_arn",
                "region",
                "endpoint_url",
            ];
            for key in keys.into_iter().chain(REST_KEYS) {
                catalog.skip(key);
            }
        }
    }
}

/// The keys only a REST catalog has.
const REST_KEYS: [&str; 5] = [
    "warehouse",
    "token",
    "credential",
    "oauth2_server_uri",
    "scope",
];

/// The REST catalog's keys refused in a catalog of `kind`.
fn refuse_rest_keys(catalog: &mut Fields<'_>, kind: &str) {
    for key in REST_KEYS {
        let why = match key {
            "warehouse" => format!(
                "a REST catalog's key: a {kind} catalog's files go to sink.warehouse (a key of \
                 the sink, not of its catalog)"
            ),
            _ => format!("a REST catalog's key: a {kind} catalog has none"),
        };
        catalog.refuse(key, &why);
    }
}

/// `sink.target_file_mb`.
const TARGET_FILE_MB: Field = defaulted(
    "target_file_mb",
    of::<u32>(),
    || json!(DEFAULT_TARGET_FILE_MB),
    "Roll a data file at this size (MiB); every commit also closes the open files.",
);

/// `sink.commit_interval_secs`.
const COMMIT_INTERVAL_SECS: Field = defaulted(
    "commit_interval_secs",
    of::<u32>(),
    || json!(DEFAULT_COMMIT_INTERVAL_SECS),
    "Commit what was written at least this often (a commit also happens when a file rolls \
         and when the run stops); 0: after every batch.",
);

/// `sink.partition_by`.
const PARTITION_BY: Field = optional(
    "partition_by",
    of::<Vec<String>>(),
    "Partition the rows by these terms, as Iceberg does: a column, or day(c), hour(c), \
         month(c), year(c) of a timestamp, bucket(N, c), truncate(W, c); [] for none. Unset: \
         changes by day(event_time), snapshots not at all.",
);

/// `sink.compression`.
const COMPRESSION: Field = defaulted(
    "compression",
    of::<FileCompression>(),
    || json!(FileCompression::Snappy.name()),
    "How the files' pages are compressed: snappy (what every reader reads), zstd (smaller \
         files, more CPU) or none (the least CPU).",
);

impl Choice for FileCompression {
    fn all() -> &'static [Self] {
        &[
            FileCompression::Snappy,
            FileCompression::Zstd,
            FileCompression::None,
        ]
    }
    fn name(self) -> &'static str {
        match self {
            FileCompression::Snappy => "snappy",
            FileCompression::Zstd => "zstd",
            FileCompression::None => "none",
        }
    }
    fn hint(found: &str) -> Option<&'static str> {
        matches!(found, "gzip" | "lz4" | "brotli" | "uncompressed")
            .then_some("the parquet sink writes snappy, zstd or none")
    }
}

/// The `parquet` sink (docs/sinks.md §7.10).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParquetConfig {
    /// `s3://bucket/prefix` or a directory; `{table}`, `{pipeline}` filled in at the run.
    pub path: String,
    /// The bucket's region.
    pub s3_region: Option<String>,
    /// An S3 endpoint (path-style).
    pub s3_endpoint_url: Option<EndpointUrl>,
    /// Roll files at this size, MiB.
    pub target_file_mb: u32,
    /// Commit at least this often, seconds.
    pub commit_interval_secs: u32,
    /// The typed columns beside the key and the document (docs/sinks.md §7.9).
    pub columns: Vec<ColumnConfig>,
    /// What a value that does not fit its column does.
    pub on_type_mismatch: OnMismatch,
    /// How the files' pages are compressed.
    pub compression: FileCompression,
    /// `partition_by` as written; unset: the default of the records (`partition` rule 4).
    pub partition_by: Option<Vec<String>>,
    /// `type: iceberg`: the table the files are committed to; `path` is its warehouse (boxed:
    /// a parquet sink has none).
    pub iceberg: Option<Box<IcebergConfig>>,
}

/// Where the iceberg sink's table is (docs/sinks.md §7.11).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IcebergConfig {
    /// `catalog.type`.
    pub catalog_type: CatalogType,
    /// `catalog.uri` (`sql`): the SQLite file or the PostgreSQL URL (which may hold a
    /// password).
    pub catalog_uri: Secret,
    /// `catalog.name` (`sql`).
    pub catalog_name: String,
    /// `catalog.catalog_id` (`glue`).
    pub catalog_id: Option<String>,
    /// `catalog.table_bucket_arn` (`s3tables`).
    pub table_bucket_arn: Option<String>,
    /// `catalog.region` (`glue`, `s3tables`).
    pub catalog_region: Option<String>,
    /// `catalog.endpoint_url` (`glue`, `s3tables`).
    pub catalog_endpoint_url: Option<EndpointUrl>,
    /// A REST catalog's keys beside `uri`.
    pub rest: RestConfig,
    /// The table's namespace.
    pub namespace: String,
    /// The table's name; `{table}` filled in when the file was loaded.
    pub table: String,
    /// Set on the table when a run creates or claims it.
    pub table_properties: BTreeMap<String, String>,
}

/// A REST catalog's keys beside `uri` (docs/sinks.md §7.11 rule 1).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RestConfig {
    /// `catalog.warehouse`: the server's name of the warehouse.
    pub warehouse: Option<String>,
    /// `catalog.token`.
    pub token: Option<Secret>,
    /// `catalog.credential`: `<client_id>:<client_secret>`.
    pub credential: Option<Secret>,
    /// `catalog.oauth2_server_uri`.
    pub oauth2_server_uri: Option<EndpointUrl>,
    /// `catalog.scope`.
    pub scope: Option<String>,
}

/// Reads the parquet sink's keys.
pub(crate) fn read(f: &mut Fields<'_>) -> ParquetConfig {
    let path = f.required::<String>("path").unwrap_or_default();
    read_files(f, path, None)
}

/// Reads the iceberg sink's keys.
pub(crate) fn read_iceberg(f: &mut Fields<'_>) -> ParquetConfig {
    let mut iceberg = IcebergConfig {
        catalog_type: CatalogType::Sql,
        catalog_uri: Secret::new(""),
        catalog_name: DEFAULT_CATALOG_NAME.to_string(),
        catalog_id: None,
        table_bucket_arn: None,
        catalog_region: None,
        catalog_endpoint_url: None,
        rest: RestConfig::default(),
        namespace: f.or("namespace", DEFAULT_NAMESPACE.to_string()),
        table: f.or("table", "{table}".to_string()),
        table_properties: f.map("table_properties", convert::<String>),
    };
    if let Some(mut catalog) = f.required_section("catalog") {
        read_catalog(&mut catalog, &mut iceberg);
        catalog.finish();
    }
    // An S3 table's files are where the service places them (`catalog` rule 3).
    let warehouse = match iceberg.catalog_type {
        CatalogType::S3Tables => {
            f.refuse(
                "warehouse",
                "an S3 table's files are where S3 Tables places them: give no warehouse",
            );
            None
        }
        CatalogType::Sql | CatalogType::Glue | CatalogType::Rest => {
            let warehouse = f.get::<String>("warehouse");
            if warehouse.is_none() {
                f.missing("warehouse");
            }
            warehouse
        }
    };
    read_files(f, warehouse.unwrap_or_default(), Some(Box::new(iceberg)))
}

/// The keys both lake sinks have.
fn read_files(
    f: &mut Fields<'_>,
    path: String,
    iceberg: Option<Box<IcebergConfig>>,
) -> ParquetConfig {
    let (columns, on_type_mismatch) = columns::read_typed(f);
    ParquetConfig {
        columns,
        on_type_mismatch,
        iceberg,
        compression: f.or("compression", FileCompression::Snappy),
        partition_by: f.get::<Vec<String>>("partition_by").map(rejoined),
        path,
        s3_region: f.get("s3_region"),
        s3_endpoint_url: f.get("s3_endpoint_url"),
        target_file_mb: f.or("target_file_mb", DEFAULT_TARGET_FILE_MB),
        commit_interval_secs: f.or("commit_interval_secs", DEFAULT_COMMIT_INTERVAL_SECS),
    }
}

/// `partition_by`'s terms with the ones a YAML flow list cut at a comma made whole again:
/// `[bucket(16, pk)]` reads as `bucket(16` and `pk)`, and no term leaves a parenthesis open.
fn rejoined(items: Vec<String>) -> Vec<String> {
    let open = |term: &str| term.matches('(').count() > term.matches(')').count();
    let mut terms: Vec<String> = Vec::new();
    for item in items {
        match terms.last_mut() {
            Some(last) if open(last) => {
                last.push_str(", ");
                last.push_str(item.trim());
            }
            _ => terms.push(item),
        }
    }
    terms
}

/// The parquet rules: a location ddbpipe can write (an s3:// URL or a directory), files of at
/// least 1 MiB.
pub(crate) fn validate(parquet: &ParquetConfig, errors: &mut Vec<ConfigError>) {
    let place = match parquet.iceberg {
        Some(_) => "sink.warehouse",
        None => "sink.path",
    };
    let placed = (parquet.iceberg.as_ref())
        .is_some_and(|iceberg| iceberg.catalog_type == CatalogType::S3Tables);
    if !placed && let Err(problem) = Location::parse(&parquet.path) {
        errors.push(ConfigError::new(place, problem));
    }
    if let Some(iceberg) = &parquet.iceberg {
        if let Some(arn) = &iceberg.table_bucket_arn
            && let Err(problem) = table_bucket_region(arn)
        {
            errors.push(ConfigError::new("sink.catalog.table_bucket_arn", problem));
        }
        let uri = iceberg.catalog_uri.expose();
        let name = iceberg.catalog_name.clone();
        if iceberg.catalog_type == CatalogType::Sql
            && !uri.is_empty()
            && let Err(problem) = SqlCatalog::from_uri(uri, Path::new(""), name)
        {
            errors.push(ConfigError::new("sink.catalog.uri", problem));
        }
        if iceberg.catalog_type == CatalogType::Rest
            && !uri.is_empty()
            && let Err(problem) = EndpointUrl::new(uri)
        {
            errors.push(ConfigError::new("sink.catalog.uri", problem.to_string()));
        }
        let properties = iceberg.table_properties.clone().into_iter().collect();
        if let Some(problem) = ddbpipe_lake::iceberg::properties_problem(&properties) {
            errors.push(ConfigError::new("sink.table_properties", problem));
        }
        for key in iceberg.table_properties.keys() {
            if key.starts_with("ddbpipe.") {
                errors.push(ConfigError::new(
                    format!("sink.table_properties.{key}"),
                    "ddbpipe.* properties are ddbpipe's own: choose another name",
                ));
            }
        }
        for (key, value) in [
            ("sink.namespace", &iceberg.namespace),
            ("sink.table", &iceberg.table),
        ] {
            if value.is_empty() || value.contains(['.', '/']) {
                errors.push(ConfigError::new(
                    key,
                    format!("'{value}' is not a name: give one without '.' or '/'"),
                ));
            }
        }
        // The table's name is judged with each table's (`config::tables::destination_name_problem`).
        if placed
            && let Some(problem) =
                s3tables_name_problem(&stored_name(iceberg, &iceberg.namespace), true)
        {
            errors.push(ConfigError::new(
                "sink.namespace",
                format!("{problem}: give one it takes"),
            ));
        }
    }
    for (i, term) in parquet.partition_by.iter().flatten().enumerate() {
        if let Err(problem) = Term::parse(term) {
            errors.push(ConfigError::new(format!("sink.partition_by[{i}]"), problem));
        }
    }
    if parquet.target_file_mb == 0 {
        errors.push(ConfigError::new(
            "sink.target_file_mb",
            "a data file must be allowed at least 1 MiB",
        ));
    }
    columns::validate(
        Dialect::Lake,
        Some(DEFAULT_DOCUMENT_COLUMN),
        &parquet.columns,
        errors,
    );
}

/// A relative directory (and a relative catalog file) is relative to the pipeline file's
/// directory. An iceberg sink's warehouse and catalog file become absolute paths: the table's location
/// is written into its metadata for every reader, whatever its working directory.
pub(crate) fn anchor(config_dir: &Path, parquet: &mut ParquetConfig) {
    let iceberg = parquet.iceberg.is_some();
    if let Ok(Location::Local(mut path)) = Location::parse(&parquet.path) {
        crate::yaml::anchor(config_dir, &mut path);
        if iceberg {
            path = std::path::absolute(&path).unwrap_or(path);
        }
        parquet.path = path.display().to_string();
    }
    if let Some(iceberg) = &mut parquet.iceberg
        && let Ok(mut path) = SqlCatalog::path_of(iceberg.catalog_uri.expose(), Path::new(""))
        && path.is_relative()
    {
        crate::yaml::anchor(config_dir, &mut path);
        let path = std::path::absolute(&path).unwrap_or(path);
        iceberg.catalog_uri = Secret::new(format!("sqlite:///{}", path.display()));
    }
}
