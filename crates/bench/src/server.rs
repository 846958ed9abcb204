//! `ddbpipe-bench serve`: a local DynamoDB endpoint that answers `Scan` of the bench table,
//! and `DescribeStream`, `GetShardIterator` and `GetRecords` of the bench stream (see
//! [`crate::stream_server`]), from memory.
//!
//! # Layout
//! Every item is serialized once, before the port is announced, into one buffer with commas
//! between items. Any run of consecutive items is then one slice of it, so a page of any
//! segment, start key and `Limit` is `head + slice + tail`. For the pages a scan with the
//! announced segment count and the default page size asks for, `head` (status line, headers,
//! `{"Items":[`) and `tail` (counts, `LastEvaluatedKey`, `ConsumedCapacity`) are built
//! beforehand too, so answering is three slices handed to one `writev`. Other page shapes
//! build their ~200-byte head and tail on the fly.
//!
//! # Paging
//! Segment `s` of `T` holds items `[s·N/T, (s+1)·N/T)`. A page starts after
//! `ExclusiveStartKey` (or at the segment's first item) and holds `min(Limit, page_items)`
//! items; `LastEvaluatedKey` is the key of its last item unless the segment ends there.
//!
//! # HTTP
//! HTTP/1.1 with keep-alive and `Content-Length` bodies, which is what the AWS SDK sends. The
//! process exits when its standard input closes (the bench holds the other end).

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::{IoSlice, Write as _};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use serde::Deserialize;
use serde_json::{Value as Json, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

use crate::items::{self, TABLE};
use crate::stream_server::{Stream, StreamSettings};

/// What the server prints on its first line of stdout once it is ready.
#[derive(Debug, serde::Serialize, Deserialize)]
pub struct Ready {
    /// The port it listens on, on 127.0.0.1.
    pub port: u16,
    /// Items in the table.
    pub items: u64,
    /// Mean DynamoDB size of an item, in bytes.
    pub mean_item_bytes: f64,
    /// Mean size of an item's attribute JSON on the wire, in bytes.
    pub mean_wire_bytes: f64,
    /// Change records in the stream.
    pub records: u64,
    /// Shards of the stream.
    pub shards: u32,
    /// Mean `SizeBytes` of a change record.
    pub mean_record_bytes: f64,
    /// Mean size of a change record's JSON on the wire, in bytes.
    pub mean_record_wire_bytes: f64,
}

/// Settings of the served table.
#[derive(Debug, Clone, Copy)]
pub struct ServeSettings {
    /// Items in the table.
    pub items: u64,
    /// The segment count whose pages are pre-built.
    pub segments: u32,
    /// Items per page when the request has no smaller `Limit` (the "1 MB" of the bench).
    pub page_items: u64,
    /// Every item padded to about this many bytes (`items::padded_to`); 0: as generated.
    pub item_bytes: u64,
    /// The stream.
    pub stream: StreamSettings,
    /// How long every answer waits before it is sent: the round trip of a real endpoint,
    /// which concurrent reads hide (zero: answer at once).
    pub latency: Duration,
}

/// Rows of JSON serialized one after the other, with commas between them: any run of
/// consecutive rows is one slice.
#[derive(Default)]
pub(crate) struct Rows {
    /// `row,row,...,row`.
    bytes: Vec<u8>,
    /// Where row `i` starts in `bytes`.
    starts: Vec<usize>,
    /// Where row `i` ends in `bytes`.
    ends: Vec<usize>,
}

impl Rows {
    /// Room for `count` rows of about `row_bytes` each.
    pub(crate) fn with_capacity(count: usize, row_bytes: usize) -> Self {
        Rows {
            bytes: Vec::with_capacity(count.saturating_mul(row_bytes)),
            starts: Vec::with_capacity(count),
            ends: Vec::with_capacity(count),
        }
    }

    /// Appends one row.
    pub(crate) fn push(&mut self, row: &Json) -> anyhow::Result<()> {
        if !self.starts.is_empty() {
            self.bytes.push(b',');
        }
        self.starts.push(self.bytes.len());
        serde_json::to_writer(&mut self.bytes, row)?;
        self.ends.push(self.bytes.len());
        Ok(())
    }

    /// Rows held.
    pub(crate) fn len(&self) -> u64 {
        self.starts.len() as u64
    }

    /// Bytes of JSON held, commas included.
    pub(crate) fn byte_len(&self) -> usize {
        self.bytes.len()
    }

    /// Rows `[first, first + count)` as one slice (empty when `count` is 0).
    pub(crate) fn slice(&self, first: u64, count: u64) -> &[u8] {
        if count == 0 {
            return &[];
        }
        let start = self.starts[first as usize];
        let end = self.ends[(first + count - 1) as usize];
        &self.bytes[start..end]
    }
}

/// The serialized table.
struct Table {
    /// The items, as attribute JSON.
    rows: Rows,
    /// `sizes[i]` = DynamoDB size of items `0..i`.
    sizes: Vec<u64>,
}

impl Table {
    fn build(count: u64, item_bytes: u64) -> anyhow::Result<Self> {
        let count_usize = usize::try_from(count).context("too many items")?;
        let mut table = Table {
            rows: Rows::with_capacity(count_usize, 800),
            sizes: Vec::with_capacity(count_usize + 1),
        };
        table.sizes.push(0);
        for index in 0..count {
            let item = items::padded_to(index, item_bytes);
            let size = item.as_object().map_or(0, items::item_size);
            table.rows.push(&item)?;
            let total = table.sizes.last().copied().unwrap_or(0) + size;
            table.sizes.push(total);
        }
        Ok(table)
    }

    fn len(&self) -> u64 {
        self.rows.len()
    }

    /// Items `[first, first + count)` as one slice.
    fn slice(&self, first: u64, count: u64) -> &[u8] {
        self.rows.slice(first, count)
    }

    /// Capacity units of reading items `[first, first + count)` eventually consistent: half
    /// a unit per 4 KB, rounded up.
    fn capacity(&self, first: u64, count: u64) -> f64 {
        let bytes = self.sizes[(first + count) as usize] - self.sizes[first as usize];
        bytes.div_ceil(4096).max(1) as f64 * 0.5
    }
}

/// The pre-built head and tail of one page.
struct Framing {
    count: u64,
    head: Vec<u8>,
    tail: Vec<u8>,
}

/// One answer: a page (three slices) or a whole response (an error, a small answer).
pub(crate) enum Answer<'a> {
    Page {
        head: Cow<'a, [u8]>,
        items: &'a [u8],
        tail: Cow<'a, [u8]>,
    },
    Whole(Vec<u8>),
}

struct Server {
    table: Table,
    stream: Stream,
    page_items: u64,
    /// Pre-built framing by (total segments, segment, first item).
    framing: HashMap<(u32, u32, u64), Framing>,
}

const ITEMS_OPEN: &[u8] = b"{\"Items\":[";

pub(crate) fn http_head(status: &str, body_len: usize) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/x-amz-json-1.0\r\n\
         Content-Length: {body_len}\r\nx-amzn-RequestId: ddbpipe-bench\r\n\r\n"
    )
    .into_bytes()
}

/// The part of a `Scan` request the server reads.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ScanRequest {
    table_name: String,
    segment: Option<u32>,
    total_segments: Option<u32>,
    limit: Option<u32>,
    exclusive_start_key: Option<Json>,
}

impl Server {
    fn build(settings: ServeSettings) -> anyhow::Result<Self> {
        let table = Table::build(settings.items, settings.item_bytes)?;
        let mut server = Server {
            table,
            stream: Stream::build(settings.stream)?,
            page_items: settings.page_items.max(1),
            framing: HashMap::new(),
        };
        let total = settings.segments.max(1);
        for segment in 0..total {
            let (low, high) = server.segment_range(segment, total);
            let mut first = low;
            loop {
                let count = server.page_items.min(high - first);
                let (head, tail) = server.framing(first, count, high);
                server
                    .framing
                    .insert((total, segment, first), Framing { count, head, tail });
                first += count;
                if first >= high {
                    break;
                }
            }
        }
        Ok(server)
    }

    fn segment_range(&self, segment: u32, total: u32) -> (u64, u64) {
        let n = u128::from(self.table.len());
        let bound = |s: u32| (n * u128::from(s) / u128::from(total)) as u64;
        (bound(segment), bound(segment + 1))
    }

    /// The HTTP head + `{"Items":[`, and the rest of the body, of items
    /// `[first, first + count)` of a segment ending at `high`.
    fn framing(&self, first: u64, count: u64, high: u64) -> (Vec<u8>, Vec<u8>) {
        let mut tail = Vec::with_capacity(256);
        let _ = write!(tail, "],\"Count\":{count},\"ScannedCount\":{count},");
        if first + count < high {
            let key = items::key_json(first + count - 1);
            let _ = write!(tail, "\"LastEvaluatedKey\":{key},");
        }
        let units = if count == 0 {
            0.5
        } else {
            self.table.capacity(first, count)
        };
        let _ = write!(
            tail,
            "\"ConsumedCapacity\":{{\"TableName\":\"{TABLE}\",\"CapacityUnits\":{units:?}}}}}"
        );
        let items_len = if count == 0 {
            0
        } else {
            self.table.slice(first, count).len()
        };
        let mut head = http_head("200 OK", ITEMS_OPEN.len() + items_len + tail.len());
        head.extend_from_slice(ITEMS_OPEN);
        (head, tail)
    }

    fn answer(&self, target: Option<&str>, body: &[u8]) -> Answer<'_> {
        match target {
            Some("DynamoDB_20120810.Scan") => {}
            Some("DynamoDB_20120810.DescribeTable") => return self.describe(body),
            Some(streams) if streams.starts_with("DynamoDBStreams_20120810.") => {
                let operation = &streams["DynamoDBStreams_20120810.".len()..];
                return self.stream.answer(operation, body);
            }
            other => {
                return error(
                    "com.amazonaws.dynamodb.v20120810#UnknownOperationException",
                    &format!(
                        "the bench server only answers Scan, DescribeTable and DynamoDB Streams, not {other:?}"
                    ),
                );
            }
        }
        let request: ScanRequest = match serde_json::from_slice(body) {
            Ok(request) => request,
            Err(e) => {
                return error(
                    "com.amazon.coral.validation#SerializationException",
                    &e.to_string(),
                );
            }
        };
        match self.page(&request) {
            Ok(answer) => answer,
            Err(message) => error("com.amazon.coral.validation#ValidationException", &message),
        }
    }

    /// `DescribeTable` of the bench table, as `ddbpipe run` asks it before the meter starts:
    /// its key schema, item count and stream. The table is described under the name asked
    /// for, one of [`served`].
    fn describe(&self, body: &[u8]) -> Answer<'static> {
        let name = serde_json::from_slice::<Json>(body)
            .ok()
            .and_then(|request| request["TableName"].as_str().map(str::to_string))
            .unwrap_or_else(|| TABLE.to_string());
        if !served(&name) {
            return error(
                "com.amazonaws.dynamodb.v20120810#ResourceNotFoundException",
                &format!("no table {name:?}; the bench table is {TABLE:?}"),
            );
        }
        let body = json!({"Table": {
            "TableName": name,
            "TableArn": format!("arn:aws:dynamodb:us-east-1:000000000000:table/{name}"),
            "TableStatus": "ACTIVE",
            "KeySchema": [
                {"AttributeName": "pk", "KeyType": "HASH"},
                {"AttributeName": "sk", "KeyType": "RANGE"},
            ],
            "AttributeDefinitions": [
                {"AttributeName": "pk", "AttributeType": "S"},
                {"AttributeName": "sk", "AttributeType": "N"},
            ],
            "ItemCount": self.table.len(),
            "StreamSpecification": {"StreamEnabled": true, "StreamViewType": "NEW_AND_OLD_IMAGES"},
            "LatestStreamArn": crate::records::STREAM_ARN,
            "LatestStreamLabel": crate::records::STREAM_LABEL,
        }})
        .to_string();
        let mut bytes = http_head("200 OK", body.len());
        bytes.extend_from_slice(body.as_bytes());
        Answer::Whole(bytes)
    }

    fn page(&self, request: &ScanRequest) -> Result<Answer<'_>, String> {
        if !served(&request.table_name) {
            return Err(format!(
                "no table {:?}; the bench table is {TABLE:?}",
                request.table_name
            ));
        }
        let (segment, total) = match (request.segment, request.total_segments) {
            (Some(segment), Some(total)) if total > 0 && segment < total => (segment, total),
            (None, None) => (0, 1),
            other => return Err(format!("bad Segment/TotalSegments {other:?}")),
        };
        let (low, high) = self.segment_range(segment, total);
        let first = match &request.exclusive_start_key {
            None => low,
            Some(key) => {
                let index = key["pk"]["S"]
                    .as_str()
                    .and_then(items::key_index)
                    .ok_or_else(|| format!("bad ExclusiveStartKey {key}"))?;
                if !(low..high).contains(&index) {
                    return Err(format!(
                        "ExclusiveStartKey item {index} is not in segment {segment} of {total}"
                    ));
                }
                index + 1
            }
        };
        let limit = request.limit.map_or(u64::MAX, u64::from);
        let count = limit.min(self.page_items).min(high - first);
        let items = if count == 0 {
            &[][..]
        } else {
            self.table.slice(first, count)
        };
        if let Some(framing) = self.framing.get(&(total, segment, first))
            && framing.count == count
        {
            return Ok(Answer::Page {
                head: Cow::Borrowed(&framing.head),
                items,
                tail: Cow::Borrowed(&framing.tail),
            });
        }
        let (head, tail) = self.framing(first, count, high);
        Ok(Answer::Page {
            head: Cow::Owned(head),
            items,
            tail: Cow::Owned(tail),
        })
    }
}

/// Whether the server answers for table `name`: the bench table, under its own name or as
/// any `bench-<suffix>` (the tables case's many tables, each the same items).
fn served(name: &str) -> bool {
    name == TABLE
        || name
            .strip_prefix(TABLE)
            .is_some_and(|rest| rest.len() > 1 && rest.starts_with('-'))
}

pub(crate) fn error(kind: &str, message: &str) -> Answer<'static> {
    let body = json!({"__type": kind, "message": message}).to_string();
    let mut bytes = http_head("400 Bad Request", body.len());
    bytes.extend_from_slice(body.as_bytes());
    Answer::Whole(bytes)
}

/// The request head fields the server needs.
#[derive(Debug, Default)]
struct RequestHead {
    content_length: usize,
    target: Option<String>,
    close: bool,
    expect_continue: bool,
}

fn parse_head(head: &[u8]) -> anyhow::Result<RequestHead> {
    let text = std::str::from_utf8(head).context("request head is not UTF-8")?;
    let mut lines = text.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut parsed = RequestHead {
        close: request_line.ends_with("HTTP/1.0"),
        ..RequestHead::default()
    };
    for line in lines.filter(|line| !line.is_empty()) {
        let Some((name, value)) = line.split_once(':') else {
            anyhow::bail!("bad header line {line:?}");
        };
        let value = value.trim();
        match name.trim().to_ascii_lowercase().as_str() {
            "content-length" => parsed.content_length = value.parse()?,
            "x-amz-target" => parsed.target = Some(value.to_string()),
            "connection" => parsed.close = value.eq_ignore_ascii_case("close"),
            "expect" => parsed.expect_continue = value.eq_ignore_ascii_case("100-continue"),
            "transfer-encoding" => anyhow::bail!("chunked request bodies are not supported"),
            _ => {}
        }
    }
    Ok(parsed)
}

fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4)
}

/// Writes every part, in order, with as few `writev` calls as the socket allows.
async fn write_parts(stream: &mut TcpStream, parts: &[&[u8]]) -> std::io::Result<()> {
    let mut parts: Vec<&[u8]> = parts.iter().copied().filter(|p| !p.is_empty()).collect();
    let mut next = 0;
    while next < parts.len() {
        let slices: Vec<IoSlice<'_>> = parts[next..].iter().map(|p| IoSlice::new(p)).collect();
        let mut written = stream.write_vectored(&slices).await?;
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while written > 0 {
            if written >= parts[next].len() {
                written -= parts[next].len();
                next += 1;
            } else {
                parts[next] = &parts[next][written..];
                written = 0;
            }
        }
    }
    Ok(())
}

async fn connection(
    server: Arc<Server>,
    mut stream: TcpStream,
    latency: Duration,
) -> anyhow::Result<()> {
    stream.set_nodelay(true)?;
    let mut buf: Vec<u8> = Vec::with_capacity(16 * 1024);
    loop {
        let head_end = loop {
            if let Some(end) = find_head_end(&buf) {
                break end;
            }
            anyhow::ensure!(buf.len() <= 64 * 1024, "request head over 64 KiB");
            if stream.read_buf(&mut buf).await? == 0 {
                return Ok(()); // The client closed the connection.
            }
        };
        let head = parse_head(&buf[..head_end])?;
        if head.expect_continue {
            stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await?;
        }
        let end = head_end + head.content_length;
        while buf.len() < end {
            if stream.read_buf(&mut buf).await? == 0 {
                return Ok(());
            }
        }
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        match server.answer(head.target.as_deref(), &buf[head_end..end]) {
            Answer::Page { head, items, tail } => {
                write_parts(&mut stream, &[&head, items, &tail]).await?;
            }
            Answer::Whole(bytes) => stream.write_all(&bytes).await?,
        }
        buf.drain(..end);
        if head.close {
            return Ok(());
        }
    }
}

/// Builds the table, prints [`Ready`] and serves until standard input closes.
pub fn serve(settings: ServeSettings) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let latency = settings.latency;
    runtime.block_on(async move {
        let server = Arc::new(Server::build(settings)?);
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let n = server.table.len().max(1) as f64;
        let ready = Ready {
            port: listener.local_addr()?.port(),
            items: server.table.len(),
            mean_item_bytes: server.table.sizes.last().copied().unwrap_or(0) as f64 / n,
            mean_wire_bytes: server.table.rows.byte_len() as f64 / n,
            records: server.stream.len(),
            shards: server.stream.shards(),
            mean_record_bytes: server.stream.mean_record_bytes(),
            mean_record_wire_bytes: server.stream.mean_wire_bytes(),
        };
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{}", serde_json::to_string(&ready)?)?;
        stdout.flush()?;
        drop(stdout);
        // The bench holds our stdin: when it closes (the bench ended or died), so do we.
        std::thread::spawn(|| {
            let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
            std::process::exit(0);
        });
        loop {
            let (stream, _) = listener.accept().await?;
            let server = Arc::clone(&server);
            tokio::spawn(async move {
                if let Err(error) = connection(server, stream, latency).await {
                    eprintln!("ddbpipe-bench serve: connection failed: {error:#}");
                }
            });
        }
    })
}

#[cfg(test)]
pub(crate) mod tests;
