//! A Parquet file being written (`parquet` rule 1): its encoder, rows and partition, and how
//! its pages are compressed.

use iceberg::spec::Struct;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;

use crate::failure::Failure;
use crate::rows::Shape;

/// How a Parquet file's pages are compressed (`sink.compression`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FileCompression {
    /// Snappy: what every reader reads, and cheap.
    #[default]
    Snappy,
    /// Zstandard (level 1): smaller files for more CPU.
    Zstd,
    /// None: the least CPU, the largest files.
    None,
}

impl FileCompression {
    fn codec(self) -> Compression {
        match self {
            FileCompression::Snappy => Compression::SNAPPY,
            FileCompression::Zstd => Compression::ZSTD(ZstdLevel::default()),
            FileCompression::None => Compression::UNCOMPRESSED,
        }
    }
}

/// An open Parquet file (`parquet` rule 1).
pub(super) struct OpenFile {
    pub(super) writer: ArrowWriter<Vec<u8>>,
    pub(super) rows: u64,
    /// Its partition's values (an Iceberg data file's partition).
    pub(super) values: Struct,
}

/// Rows a row group holds at most.
const ROW_GROUP_ROWS: usize = 64 * 1024;

pub(super) fn open_file(
    shape: &Shape,
    compression: FileCompression,
    values: Struct,
) -> Result<OpenFile, Failure> {
    let mut properties = WriterProperties::builder()
        .set_compression(compression.codec())
        .set_created_by(format!("ddbpipe {}", env!("CARGO_PKG_VERSION")))
        // A row group is held encoded until it is complete, then copied into the file: groups
        // of 64 Ki rows keep that second copy small beside the file (the bench's peak RSS).
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS));
    // Columns whose values are (nearly) all distinct: a dictionary is built only to be given
    // up, and min/max over whole documents helps no reader (the bench's profile: issue 29).
    for name in shape.distinct_columns() {
        properties = properties.set_column_dictionary_enabled(ColumnPath::from(name), false);
    }
    for name in ["document", "before"] {
        properties = properties
            .set_column_statistics_enabled(ColumnPath::from(name), EnabledStatistics::None);
    }
    let properties = properties.build();
    let writer = ArrowWriter::try_new(Vec::new(), shape.schema().clone(), Some(properties))
        .map_err(|e| Failure::definite(format!("cannot start a Parquet file: {e}")))?;
    Ok(OpenFile {
        writer,
        rows: 0,
        values,
    })
}
