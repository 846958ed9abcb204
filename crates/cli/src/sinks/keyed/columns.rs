//! The typed columns of the sqlite and postgres sinks (docs/sinks.md §7.9): `sink.columns`,
//! `sink.document_column` and `sink.on_type_mismatch`, as the walker reads them and the rules
//! they must keep.
//!
//! # Rules
//! 1. Each entry of `columns` is `{name, path, type, format?}`. `path` must parse
//!    ([`ColumnPath::parse`], its message names what is wrong), `type` must be a column type
//!    (the message lists them), `format` an [`TimeFormat`] and only on a `timestamptz` column.
//! 2. A column's name is not empty, does not start with the reserved `_ddbpipe_`, is not the
//!    document column's and not another column's. SQLite compares column names without regard
//!    to ASCII case (`Status` is `status` there); PostgreSQL names are compared as written
//!    (ddbpipe quotes them) and are at most 63 bytes (PostgreSQL would cut a longer one).
//! 3. A column named like a key attribute is refused when the table's key schema is known
//!    (`build::table_spec`): the key is stored in its own columns already.
//! 4. `document_column` unset is `document`; an explicit `null` stores no document (only the
//!    key and the typed columns; a loss the file states). `on_type_mismatch` is `null` (the
//!    default; YAML `null` says the same) or `fail`.

use ddbpipe_keyed::OnMismatch;
use ddbpipe_source::config::ConfigError;
use ddbpipe_value::{ColumnPath, ColumnSpec, ColumnType, TimeFormat};
use serde_json::{Value as Json, json};
use yaml_serde::Value;

use crate::yaml::fields::Fields;
use crate::yaml::schema::{Field, Shape, defaulted, of, optional, required};
use crate::yaml::types::{Choice, FromYaml, did_you_mean, expected};

/// The default `document_column`.
pub const DEFAULT_DOCUMENT_COLUMN: &str = "document";
/// The longest name PostgreSQL keeps, in bytes (`NAMEDATALEN - 1`).
pub const POSTGRES_MAX_NAME_BYTES: usize = 63;
pub use ddbpipe_keyed::RESERVED_PREFIX;

/// `sink.document_column`, `sink.columns` and `sink.on_type_mismatch` of both keyed sinks.
pub(super) const DOCUMENT_COLUMN: Field = defaulted(
    "document_column",
    of::<Option<String>>(),
    || json!(DEFAULT_DOCUMENT_COLUMN),
    "The column holding the item as JSON; null: no document column, only the key and the \
     typed columns are stored.",
);
pub(crate) const COLUMNS: Field = optional(
    "columns",
    Shape::List(COLUMN),
    "Typed columns beside the key and the document: {name, path, type, format?} each, the \
     value read from the item at path.",
);
pub(crate) const ON_TYPE_MISMATCH: Field = defaulted(
    "on_type_mismatch",
    of::<Option<OnMismatch>>(),
    || json!(OnMismatch::Null.name()),
    "A value that does not fit its column's type: null (store NULL, count and log it) or \
     fail (the batch fails naming the column).",
);

/// The keys of one entry of `sink.columns`.
static COLUMN: &[Field] = &[
    required("name", of::<String>(), "The column's name in the table."),
    required(
        "path",
        of::<ColumnPath>(),
        "Where the value is in the item: an attribute, `address.city` into a map, `tags[0]` \
         into a list; a name holding . [ ] or \" in double quotes.",
    ),
    required(
        "type",
        of::<ColumnType>(),
        "The column's type: text, numeric, bigint, double, boolean, timestamptz or jsonb.",
    ),
    optional(
        "format",
        of::<TimeFormat>(),
        "timestamptz only: how the attribute holds the time, iso8601 (the default), \
         epoch_seconds or epoch_millis.",
    ),
];

/// One entry of `sink.columns` as read. A field that could not be read is `None` (its error
/// is reported already), so every entry keeps its index in messages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ColumnConfig {
    /// The column's name in the table.
    pub name: String,
    /// Where the value is in the item.
    pub path: Option<ColumnPath>,
    /// The column's type.
    pub kind: Option<ColumnType>,
    /// `format`, as given (timestamptz only; unset reads `iso8601`).
    pub format: Option<TimeFormat>,
}

impl ColumnConfig {
    /// The column as the keyed sink takes it; `None` when a field could not be read (the file
    /// did not load then).
    pub fn spec(&self) -> Option<ColumnSpec> {
        Some(ColumnSpec {
            name: self.name.clone(),
            path: self.path.clone()?,
            kind: self.kind?,
            time_format: self.format.unwrap_or_default(),
        })
    }
}

/// Reads one entry of `sink.columns`.
fn read_column(f: &mut Fields<'_>) -> ColumnConfig {
    ColumnConfig {
        name: f.required("name").unwrap_or_default(),
        path: f.required("path"),
        kind: f.required("type"),
        format: f.get("format"),
    }
}

/// The typed-column keys of a keyed sink (rule 4): the document column (`None` for an
/// explicit null), the columns and the mismatch policy.
pub(super) fn read(f: &mut Fields<'_>) -> (Option<String>, Vec<ColumnConfig>, OnMismatch) {
    let document_column = f.or("document_column", Some(DEFAULT_DOCUMENT_COLUMN.to_string()));
    let (columns, on_mismatch) = read_typed(f);
    (document_column, columns, on_mismatch)
}

/// The typed columns and the mismatch policy: the keyed sinks' and the lake's.
pub(crate) fn read_typed(f: &mut Fields<'_>) -> (Vec<ColumnConfig>, OnMismatch) {
    let columns = f.list("columns", read_column);
    // YAML `null` is the `null` policy too.
    let on_mismatch = f
        .or("on_type_mismatch", Some(OnMismatch::Null))
        .unwrap_or_default();
    (columns, on_mismatch)
}

/// The typed columns of a sink's config as the readers take them (entries that did not read
/// were reported when the file was loaded).
pub(crate) fn specs(columns: &[ColumnConfig]) -> Vec<ColumnSpec> {
    columns.iter().filter_map(ColumnConfig::spec).collect()
}

/// Which database a name is for: the rules differ (rule 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// SQLite: names compare without regard to ASCII case.
    Sqlite,
    /// PostgreSQL: names compare as written, at most 63 bytes.
    Postgres,
    /// Parquet: names compare as written.
    Lake,
}

impl Dialect {
    /// Whether two column names name the same column (rule 2).
    pub fn same_name(self, a: &str, b: &str) -> bool {
        match self {
            Dialect::Sqlite => a.eq_ignore_ascii_case(b),
            Dialect::Postgres | Dialect::Lake => a == b,
        }
    }
}

/// Rules 1–2 for the columns of a keyed sink writing to `dialect`, with `document_column`.
pub(crate) fn validate(
    dialect: Dialect,
    document_column: Option<&str>,
    columns: &[ColumnConfig],
    errors: &mut Vec<ConfigError>,
) {
    for (index, column) in columns.iter().enumerate() {
        let at = |field: &str| format!("sink.columns[{index}].{field}");
        let name = column.name.as_str();
        let earlier = columns[..index]
            .iter()
            .position(|other| dialect.same_name(&other.name, name));
        if name.trim().is_empty() {
            errors.push(ConfigError::new(at("name"), "name must not be empty"));
        } else if name.starts_with(RESERVED_PREFIX) {
            errors.push(ConfigError::new(
                at("name"),
                "names starting with _ddbpipe_ are reserved for ddbpipe's own columns",
            ));
        } else if document_column.is_some_and(|document| dialect.same_name(document, name)) {
            errors.push(ConfigError::new(
                at("name"),
                format!(
                    "'{name}' is the document column's name (sink.document_column); choose \
                     another name, or another document_column"
                ),
            ));
        } else if let Some(earlier) = earlier {
            errors.push(ConfigError::new(
                at("name"),
                format!(
                    "column '{name}' is already sink.columns[{earlier}]; each column needs a \
                     name of its own"
                ),
            ));
        } else if dialect == Dialect::Postgres && name.len() > POSTGRES_MAX_NAME_BYTES {
            errors.push(ConfigError::new(
                at("name"),
                format!(
                    "'{name}' is {} bytes; PostgreSQL names are at most {POSTGRES_MAX_NAME_BYTES} \
                     bytes (a longer one would be cut): choose a shorter name",
                    name.len()
                ),
            ));
        }
        if let (Some(format), Some(kind)) = (column.format, column.kind)
            && kind != ColumnType::Timestamptz
        {
            errors.push(ConfigError::new(
                at("format"),
                format!(
                    "format ({}) applies only to timestamptz columns; this one is {kind}: \
                     remove format or make the type timestamptz",
                    format.name()
                ),
            ));
        }
    }
}

/// A column name's problem for `dialect` (rule 2, but for the document column and other
/// columns): what `ddbpipe init --columns auto` skips an attribute for.
pub fn unusable_name(dialect: Dialect, name: &str) -> Option<String> {
    if name.trim().is_empty() {
        Some("an empty name".to_string())
    } else if name.starts_with(RESERVED_PREFIX) {
        Some("names starting with _ddbpipe_ are reserved".to_string())
    } else if dialect == Dialect::Postgres && name.len() > POSTGRES_MAX_NAME_BYTES {
        Some(format!(
            "{} bytes, PostgreSQL names are at most {POSTGRES_MAX_NAME_BYTES}",
            name.len()
        ))
    } else {
        None
    }
}

impl FromYaml for ColumnPath {
    fn from_yaml(value: Value, substituted: Option<&str>) -> Result<Self, String> {
        let text = String::from_yaml(value, substituted)?;
        ColumnPath::parse(&text)
    }
    fn schema() -> Json {
        json!({"type": "string"})
    }
    fn to_json(&self) -> Json {
        json!(self.to_string())
    }
}

impl FromYaml for ColumnType {
    fn from_yaml(value: Value, _: Option<&str>) -> Result<Self, String> {
        let names: Vec<&str> = ColumnType::ALL.iter().map(|kind| kind.name()).collect();
        let expected_names = format!("one of {}", names.join(", "));
        let Value::String(text) = &value else {
            return Err(expected(&expected_names, &value));
        };
        if let Some(kind) = ColumnType::parse(text) {
            return Ok(kind);
        }
        let mut message = format!("unknown type {text:?}, expected {expected_names}");
        if let Some(known) = did_you_mean(text, names.iter().copied()) {
            message = format!("{message} (did you mean {known}?)");
        }
        Err(message)
    }
    fn schema() -> Json {
        let mut names: Vec<&str> = ColumnType::ALL.iter().map(|kind| kind.name()).collect();
        // `ColumnType::parse` also takes PostgreSQL's spelling of `double`.
        names.push("double precision");
        json!({"type": "string", "enum": names})
    }
    fn to_json(&self) -> Json {
        json!(self.name())
    }
}

impl Choice for TimeFormat {
    fn all() -> &'static [Self] {
        &TimeFormat::ALL
    }
    fn name(self) -> &'static str {
        TimeFormat::name(self)
    }
}

impl Choice for OnMismatch {
    fn all() -> &'static [Self] {
        &[OnMismatch::Null, OnMismatch::Fail]
    }
    fn name(self) -> &'static str {
        OnMismatch::name(self)
    }
}
