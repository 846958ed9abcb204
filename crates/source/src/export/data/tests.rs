//! The two passes of a data file: verification before hand-over, decoding, validation, pages.

use std::io::Write;

use ddbpipe_value::ValueFormat;
use flate2::Compression;
use flate2::write::GzEncoder;

use ddbpipe_value::item_from_typed_json;

use super::*;

const LINES: [&str; 3] = [
    r#"{"Item":{"pk":{"S":"a"},"n":{"N":"12345678901234567890.5"},"b":{"B":"AQI="},"m":{"M":{"z":{"SS":["y","x"]},"a":{"NULL":true}}}}}"#,
    r#"{"Item":{"pk":{"S":"b\u00e9"},"l":{"L":[{"N":"1"},{"BOOL":false}]}}}"#,
    r#"{"Item":{"pk":{"S":"c"}}}"#,
];

/// The table's key: `pk`, a string.
static KEY_SCHEMA: std::sync::LazyLock<[KeyAttribute; 1]> = std::sync::LazyLock::new(|| {
    [KeyAttribute {
        name: "pk".into(),
        key_type: crate::api::KeyType::S,
    }]
});

/// A full export's `file` read in `format`, `batch` records at a time, after `skip` items.
fn full(file: &ManifestFile, format: ValueFormat, batch: usize, skip: u64) -> FileReading<'_> {
    FileReading {
        file,
        kind: ExportType::Full,
        render: Render::items(format),
        key_schema: &*KEY_SCHEMA,
        batch,
        skip,
    }
}

fn gzip(lines: &[&str]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
    for line in lines {
        encoder.write_all(line.as_bytes()).unwrap();
        encoder.write_all(b"\n").unwrap();
    }
    encoder.finish().unwrap()
}

fn file(stored: &[u8], items: u64) -> ManifestFile {
    ManifestFile {
        data_file_key: "p/AWSDynamoDB/x/data/a.json.gz".into(),
        item_count: items,
        md5_checksum: Some(STANDARD.encode(Md5::digest(stored))),
    }
}

fn read(
    stored: &[u8],
    file: &ManifestFile,
    format: ValueFormat,
) -> Result<Vec<String>, ExportError> {
    read_from(stored, file, format, 0, 2).map(|(out, _)| out)
}

/// The records handed on when `stored` is read as `file` after `skip` items, `batch` at a
/// time, and how many batches it took.
fn read_from(
    stored: &[u8],
    file: &ManifestFile,
    format: ValueFormat,
    skip: u64,
    batch: usize,
) -> Result<(Vec<String>, usize), ExportError> {
    let mut out = Vec::new();
    let mut batches = 0;
    let reading = full(file, format, batch, skip);
    read_data_file::<ExportError>(
        stored,
        &reading,
        || Ok(()),
        |lines| {
            batches += 1;
            out.extend(lines.iter().map(|l| String::from_utf8(l.to_vec()).unwrap()));
            Ok(())
        },
    )?;
    Ok((out, batches))
}

#[test]
fn exported_items_give_the_bytes_their_scan_gives_in_both_formats() {
    let stored = gzip(&LINES);
    for format in [ValueFormat::Plain, ValueFormat::Typed] {
        let got = read(&stored, &file(&stored, 3), format).unwrap();
        let want: Vec<String> = LINES
            .iter()
            .map(|line| {
                let json: serde_json::Value = serde_json::from_str(line).unwrap();
                let item = item_from_typed_json(&json["Item"], "Item").unwrap();
                let mut out = Vec::new();
                Render::items(format).write_item(&item, &mut out);
                String::from_utf8(out).unwrap()
            })
            .collect();
        assert_eq!(got, want, "{format:?}");
    }
}

#[test]
fn a_page_of_large_items_is_cut_at_its_byte_bound() {
    let big = "x".repeat(350 * 1024);
    let lines: Vec<String> = (0..7)
        .map(|i| format!(r#"{{"Item":{{"pk":{{"S":"k{i}"}},"body":{{"S":"{big}"}}}}}}"#))
        .collect();
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    let stored = gzip(&lines);
    let (out, pages) = read_from(&stored, &file(&stored, 7), ValueFormat::Plain, 0, 1000).unwrap();
    assert_eq!(out.len(), 7);
    // 350 KiB records: the third crosses 1 MiB, so pages of 3, 3 and 1 instead of one of 7.
    assert_eq!(pages, 3);
}

#[test]
fn records_are_handed_over_in_batches_and_the_file_counts_its_stored_bytes() {
    let stored = gzip(&LINES);
    let mut batches = Vec::new();
    let manifest = file(&stored, 3);
    let reading = full(&manifest, ValueFormat::Plain, 2, 0);
    let read = read_data_file::<ExportError>(
        &stored[..],
        &reading,
        || Ok(()),
        |lines| {
            batches.push(lines.len());
            Ok(())
        },
    )
    .unwrap();
    assert_eq!(batches, [2, 1]);
    assert_eq!(read.items, 3);
    assert_eq!(read.stored_bytes, stored.len() as u64);
}

#[test]
fn a_file_whose_count_or_checksum_differs_from_its_manifest_fails_naming_it() {
    let stored = gzip(&LINES);
    let error = read(&stored, &file(&stored, 4), ValueFormat::Plain).unwrap_err();
    assert_eq!(error.object, "p/AWSDynamoDB/x/data/a.json.gz");
    assert!(
        error
            .problem
            .contains("holds 3 items but its manifest says 4"),
        "{error}"
    );
    let mut damaged = file(&stored, 3);
    damaged.md5_checksum = Some(STANDARD.encode(Md5::digest(b"other")));
    let error = read(&stored, &damaged, ValueFormat::Plain).unwrap_err();
    assert!(error.problem.contains("its MD5 is"), "{error}");
    let mut unchecked = file(&stored, 3);
    unchecked.md5_checksum = None;
    assert_eq!(
        read(&stored, &unchecked, ValueFormat::Plain).unwrap().len(),
        3
    );
}

#[test]
fn a_line_that_is_not_an_item_or_not_gzip_fails_naming_the_line() {
    let stored = gzip(&[LINES[0], r#"{"Keys":{"pk":{"S":"a"}}}"#]);
    let error = read(&stored, &file(&stored, 2), ValueFormat::Plain).unwrap_err();
    assert!(error.problem.starts_with("line 2 "), "{error}");
    assert!(
        error.problem.contains("the line has no \"Item\""),
        "{error}"
    );
    let stored = gzip(&[r#"{"Item":{"pk":{"Q":"a"}}}"#]);
    let error = read(&stored, &file(&stored, 1), ValueFormat::Plain).unwrap_err();
    assert!(
        error.problem.contains("unsupported attribute value type Q"),
        "{error}"
    );
    let error = read(b"not gzip", &file(b"not gzip", 0), ValueFormat::Plain).unwrap_err();
    assert!(error.problem.contains("gzip"), "{error}");
}

#[test]
fn an_empty_file_of_an_empty_partition_reads_as_no_items() {
    let stored = gzip(&[]);
    assert!(
        read(&stored, &file(&stored, 0), ValueFormat::Plain)
            .unwrap()
            .is_empty()
    );
    // Stored as an empty object, not an empty gzip.
    assert!(
        read(b"", &file(b"", 0), ValueFormat::Plain)
            .unwrap()
            .is_empty()
    );
    let error = read(b"", &file(b"", 1), ValueFormat::Plain).unwrap_err();
    assert!(error.problem.contains("holds 0 items"), "{error}");
}

#[test]
fn a_resumed_file_skips_the_items_handed_on_before() {
    let stored = gzip(&LINES);
    let (out, _) = read_from(&stored, &file(&stored, 3), ValueFormat::Plain, 2, 10).unwrap();
    assert_eq!(out, [r#"{"pk":"c"}"#]);
}

/// Issue #24 item 6: a file whose bytes differ from its checksum hands on nothing, not
/// even the lines before the damage.
#[test]
fn a_damaged_file_hands_on_no_line_before_its_checksum_fails() {
    let many: Vec<String> = (0..700)
        .map(|i| format!(r#"{{"Item":{{"pk":{{"S":"k{i:04}"}},"n":{{"N":"{i}"}}}}}}"#))
        .collect();
    let lines: Vec<&str> = many.iter().map(String::as_str).collect();
    let stored = gzip(&lines);
    let manifest = file(&stored, 700);
    let altered: Vec<String> = many
        .iter()
        .map(|line| line.replace(r#""n":{"N":"650"}"#, r#""n":{"N":"651"}"#))
        .collect();
    let altered: Vec<&str> = altered.iter().map(String::as_str).collect();
    let damaged = gzip(&altered);
    let (read, handed) = handed_on(&damaged, &manifest, 10);
    let error = read.unwrap_err();
    assert!(error.problem.contains("its MD5 is"), "{error}");
    assert!(
        error.problem.contains("nothing of it was written"),
        "{error}"
    );
    assert_eq!(handed, 0, "no line of the damaged file was handed on");
    // The same bytes as stored verify and hand everything on.
    let (out, batches) = read_from(&stored, &manifest, ValueFormat::Plain, 0, 10).unwrap();
    assert_eq!((out.len(), batches), (700, 70));
}

/// A spool larger than its memory moves to a temporary file and reads back whole.
#[test]
fn a_file_larger_than_the_spools_memory_reads_back_whole_in_order() {
    let pad = "x".repeat(2000);
    let many: Vec<String> = (0..(SPOOL_MEMORY_BYTES / 2000 + 500))
        .map(|i| format!(r#"{{"Item":{{"pk":{{"S":"k{i:05}"}},"p":{{"S":"{pad}"}}}}}}"#))
        .collect();
    let lines: Vec<&str> = many.iter().map(String::as_str).collect();
    let stored = gzip(&lines);
    let (out, _) = read_from(
        &stored,
        &file(&stored, lines.len() as u64),
        ValueFormat::Plain,
        3,
        100,
    )
    .unwrap();
    assert_eq!(out.len(), lines.len() - 3);
    for (i, record) in out.iter().enumerate() {
        assert_eq!(
            record,
            &format!(r#"{{"p":"{pad}","pk":"k{:05}"}}"#, i + 3),
            "record {i}"
        );
    }
}

/// Issue #24 item 12: a valid gzip file of several members is read to its end.
#[test]
fn a_data_file_of_several_gzip_members_is_read_whole() {
    let mut stored = gzip(&LINES[..2]);
    stored.extend(gzip(&LINES[2..]));
    let out = read(&stored, &file(&stored, 3), ValueFormat::Plain).unwrap();
    assert_eq!(out.len(), 3);
}

/// Issue #24 item 12: bytes that are not gzip are damage (definite), not a body that broke
/// off (read again).
#[test]
fn corrupt_gzip_is_damage_and_a_broken_body_is_not() {
    let mut stored = gzip(&LINES);
    // The CRC-32 of the member's trailer.
    let crc = stored.len() - 8;
    stored[crc] ^= 0xff;
    let error = read(&stored, &file(&stored, 3), ValueFormat::Plain).unwrap_err();
    assert!(
        error.problem.starts_with("is not a valid gzip file"),
        "{error}"
    );

    struct Broken;
    impl Read for Broken {
        fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
            Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "reset",
            ))
        }
    }
    let stored = gzip(&LINES);
    let manifest = file(&stored, 3);
    let reading = full(&manifest, ValueFormat::Plain, 2, 0);
    let body = (&stored[..20]).chain(Broken);
    let error = read_data_file::<ExportError>(body, &reading, || Ok(()), |_| Ok(())).unwrap_err();
    assert!(error.problem.starts_with("cannot be read"), "{error}");
}

/// Reads `stored` as `manifest` says, of a table keyed `pk` (S), `batch` records at a time:
/// the result, and how many records were handed on (also when it failed).
fn handed_on(
    stored: &[u8],
    manifest: &ManifestFile,
    batch: usize,
) -> (Result<FileRead, ExportError>, usize) {
    let mut handed = 0;
    let reading = full(manifest, ValueFormat::Plain, batch, 0);
    let read = read_data_file::<ExportError>(
        stored,
        &reading,
        || Ok(()),
        |lines| {
            handed += lines.len();
            Ok(())
        },
    );
    (read, handed)
}

/// Reads `lines` as one file of a full export of a table keyed `pk` (S): the problem,
/// and how many records were handed on.
fn refused(lines: &[&str]) -> (String, usize) {
    let stored = gzip(lines);
    let manifest = file(&stored, lines.len() as u64);
    let (read, handed) = handed_on(&stored, &manifest, 1);
    let error = read.unwrap_err();
    assert_eq!(error.object, "p/AWSDynamoDB/x/data/a.json.gz");
    (error.problem, handed)
}

/// Issue #24 item 5: an item DynamoDB could not hold fails the file naming its line and
/// key, with nothing of the file handed on: one case per class of bad item.
#[test]
fn an_item_dynamodb_could_not_hold_fails_its_file_naming_the_line_and_key() {
    let good = r#"{"Item":{"pk":{"S":"a"},"n":{"N":"1"}}}"#;
    let huge = format!(
        r#"{{"Item":{{"pk":{{"S":"big"}},"blob":{{"S":"{}"}}}}}}"#,
        "x".repeat(5 << 20)
    );
    for (bad, key, says) in [
        (
            r#"{"Item":{"pk":{"S":"k2"},"n":{"N":"twelve"}}}"#,
            r#"pk={"S":"k2"}"#,
            r#"N value "twelve" is not a number"#,
        ),
        (
            r#"{"Item":{"pk":{"N":"2"}}}"#,
            r#"pk={"N":"2"}"#,
            "key attribute 'pk' is of type N, but the table's key schema says S",
        ),
        (
            r#"{"Item":{"other":{"S":"2"}}}"#,
            "pk missing",
            "the item has no key attribute 'pk'",
        ),
        (
            r#"{"Item":{"pk":{"S":"k2"},"m":{"M":{"x":{"NS":["1","1e999"]}}}}}"#,
            r#"pk={"S":"k2"}"#,
            r#"N value "1e999" is outside DynamoDB's range"#,
        ),
        (
            huge.as_str(),
            r#"pk={"S":"big"}"#,
            "the item is at least 5242889 bytes, over DynamoDB's limit of 400 KB",
        ),
    ] {
        let (problem, handed) = refused(&[good, bad, good]);
        assert!(
            problem.starts_with(&format!("line 2 (key {key}): ")),
            "{key}\n{problem}"
        );
        assert!(problem.contains(says), "{says}\n{problem}");
        assert!(problem.contains("nothing of it was written"), "{problem}");
        assert_eq!(handed, 0, "nothing of the file was handed on: {says}");
    }
}
