//! The two manifests of an export (see the module docs of `export`).

use serde::Deserialize;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::ExportError;

/// Full or incremental.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum ExportType {
    /// `FULL_EXPORT`: the table at `exportTime`.
    #[serde(rename = "FULL_EXPORT")]
    Full,
    /// `INCREMENTAL_EXPORT`: the changes of a window.
    #[serde(rename = "INCREMENTAL_EXPORT")]
    Incremental,
}

/// `manifest-summary.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct ManifestSummary {
    /// The export.
    pub export_arn: String,
    /// `exportTime` in unix ms: the instant a full export shows (its rows' version); for an
    /// incremental export (whose summary has none) its `exportToTime`.
    pub export_time_ms: i64,
    /// `exportFromTime` of an incremental export, in unix ms.
    pub from_ms: Option<i64>,
    /// Items in all data files.
    pub item_count: u64,
    /// Full or incremental (full when absent).
    pub export_type: ExportType,
    /// Where `manifest-files.json` is.
    pub manifest_files_key: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SummaryJson {
    export_arn: String,
    #[serde(default)]
    export_time: Option<String>,
    #[serde(default)]
    export_from_time: Option<String>,
    #[serde(default)]
    export_to_time: Option<String>,
    item_count: u64,
    output_format: String,
    #[serde(default)]
    export_type: Option<ExportType>,
    manifest_files_s3_key: String,
}

impl ManifestSummary {
    /// Reads `manifest-summary.json` (stored at `key`), rule 1.
    pub fn parse(key: &str, bytes: &[u8]) -> Result<Self, ExportError> {
        let json: SummaryJson = serde_json::from_slice(bytes)
            .map_err(|e| ExportError::new(key, format!("not an export summary: {e}")))?;
        if json.output_format != "DYNAMODB_JSON" {
            return Err(ExportError::new(
                key,
                format!(
                    "outputFormat is {}; ddbpipe reads DYNAMODB_JSON exports",
                    json.output_format
                ),
            ));
        }
        let export_type = json.export_type.unwrap_or(ExportType::Full);
        let time = |field: &str, text: &Option<String>| -> Result<Option<i64>, ExportError> {
            text.as_deref()
                .map(|text| {
                    OffsetDateTime::parse(text, &Rfc3339)
                        .map(|at| (at.unix_timestamp_nanos() / 1_000_000) as i64)
                        .map_err(|e| {
                            ExportError::new(key, format!("{field} '{text}' is not RFC 3339: {e}"))
                        })
                })
                .transpose()
        };
        let at = match export_type {
            ExportType::Full => time("exportTime", &json.export_time)?,
            ExportType::Incremental => time("exportToTime", &json.export_to_time)?
                .or(time("exportTime", &json.export_time)?),
        };
        let Some(export_time_ms) = at else {
            return Err(ExportError::new(
                key,
                match export_type {
                    ExportType::Full => "the summary has no exportTime",
                    ExportType::Incremental => "the summary has no exportToTime",
                },
            ));
        };
        Ok(ManifestSummary {
            export_arn: json.export_arn,
            export_time_ms,
            from_ms: time("exportFromTime", &json.export_from_time)?,
            item_count: json.item_count,
            export_type,
            manifest_files_key: json.manifest_files_s3_key,
        })
    }
}

/// One line of `manifest-files.json`: a data file and what it must hold.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManifestFile {
    /// The data file's S3 key.
    #[serde(rename = "dataFileS3Key")]
    pub data_file_key: String,
    /// Lines (items or changes) in it.
    pub item_count: u64,
    /// Base64 of the MD5 of the stored (compressed) file, when given.
    #[serde(default)]
    pub md5_checksum: Option<String>,
}

/// Reads `manifest-files.json` (stored at `key`): one file per non-empty line, in order.
pub fn manifest_files(key: &str, bytes: &[u8]) -> Result<Vec<ManifestFile>, ExportError> {
    let text =
        std::str::from_utf8(bytes).map_err(|e| ExportError::new(key, format!("not UTF-8: {e}")))?;
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(index, line)| {
            serde_json::from_str(line).map_err(|e| {
                ExportError::new(
                    key,
                    format!("line {}: not a data file entry: {e}", index + 1),
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SUMMARY: &str = r#"{"version":"2020-06-30","exportArn":"arn:aws:dynamodb:us-east-1:123456789012:table/orders/export/01234567890123-a1b2c3d4","startTime":"2026-11-04T07:28:34.028Z","endTime":"2026-11-04T07:33:43.897Z","tableArn":"arn:aws:dynamodb:us-east-1:123456789012:table/orders","tableId":"12345a12","exportTime":"2026-11-04T07:28:34.028Z","s3Bucket":"exports","s3Prefix":"ddbpipe/orders","s3SseAlgorithm":"AES256","s3SseKmsKeyId":null,"manifestFilesS3Key":"ddbpipe/orders/AWSDynamoDB/01234567890123-a1b2c3d4/manifest-files.json","billedSizeBytes":0,"itemCount":8,"outputFormat":"DYNAMODB_JSON"}"#;

    #[test]
    fn a_summary_reads_its_time_count_type_and_files_key() {
        let summary = ManifestSummary::parse("s", SUMMARY.as_bytes()).unwrap();
        assert_eq!(summary.item_count, 8);
        assert_eq!(summary.export_type, ExportType::Full);
        assert_eq!(summary.export_time_ms, 1_793_777_314_028);
        assert!(summary.manifest_files_key.ends_with("/manifest-files.json"));
        // AWS's incremental summary has no exportTime, but a window.
        let incremental = SUMMARY.replace(
            r#""exportTime":"2026-11-04T07:28:34.028Z","#,
            r#""exportFromTime":"2026-11-04T06:28:34.028Z","exportToTime":"2026-11-04T07:28:34.028Z","outputView":"NEW_AND_OLD_IMAGES","exportType":"INCREMENTAL_EXPORT","#,
        );
        let incremental = ManifestSummary::parse("s", incremental.as_bytes()).unwrap();
        assert_eq!(incremental.export_type, ExportType::Incremental);
        assert_eq!(incremental.export_time_ms, 1_793_777_314_028);
        assert_eq!(incremental.from_ms, Some(1_793_777_314_028 - 3_600_000));
        let timeless = SUMMARY.replace(r#""exportTime":"2026-11-04T07:28:34.028Z","#, "");
        let error = ManifestSummary::parse("s", timeless.as_bytes()).unwrap_err();
        assert!(error.problem.contains("no exportTime"), "{error}");
    }

    #[test]
    fn an_ion_export_is_refused_naming_its_format() {
        let ion = SUMMARY.replace("DYNAMODB_JSON", "ION");
        let error = ManifestSummary::parse("sum.json", ion.as_bytes()).unwrap_err();
        assert_eq!(error.object, "sum.json");
        assert!(error.problem.contains("outputFormat is ION"), "{error}");
    }

    #[test]
    fn manifest_files_are_read_line_by_line_and_a_bad_line_is_named() {
        let text = concat!(
            r#"{"itemCount":3,"md5Checksum":"sQMSpEILNgoQmarvDFonGQ==","etag":"af83-1","dataFileS3Key":"p/AWSDynamoDB/x/data/a.json.gz"}"#,
            "\n",
            r#"{"itemCount":0,"md5Checksum":"1B2M2Y8AsgTpgAmY7PhCfg==","etag":"d41d-1","dataFileS3Key":"p/AWSDynamoDB/x/data/b.json.gz"}"#,
            "\n"
        );
        let files = manifest_files("m", text.as_bytes()).unwrap();
        assert_eq!(files.len(), 2);
        assert_eq!(files[0].item_count, 3);
        assert_eq!(files[1].data_file_key, "p/AWSDynamoDB/x/data/b.json.gz");
        let error = manifest_files("m", b"{\"itemCount\":1}\nnope\n").unwrap_err();
        assert!(error.problem.starts_with("line 1:"), "{error}");
    }
}
