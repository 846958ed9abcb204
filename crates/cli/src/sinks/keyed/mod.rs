//! The sqlite and postgres sinks (docs/sinks.md §7.2, §7.3), one keyed table each with the
//! position in the same database: their config sections ([`config`]) and how a run builds
//! them ([`build`]); the writing is `ddbpipe_keyed`.

mod build;
pub(crate) mod columns;
mod config;

pub(crate) use build::table_name_of;
pub use build::{
    another_writer, destination_table, keyed_sink, libpq_defaults, lock, open_existing,
    reset_database_state, table_spec,
};
pub use columns::{DEFAULT_DOCUMENT_COLUMN, Dialect, unusable_name};
pub use config::{KeyedConfig, PostgresConfig, SqliteConfig, stale_rows_warning};
pub(crate) use config::{POSTGRES, SQLITE, read_postgres, read_sqlite, validate};
