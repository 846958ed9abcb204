//! The bench server's answers: pages, framing, `DescribeTable`, the table names it serves.

use super::*;

fn server(items: u64, segments: u32, page_items: u64) -> Server {
    Server::build(ServeSettings {
        items,
        segments,
        page_items,
        item_bytes: 0,
        stream: StreamSettings {
            records: 0,
            shards: 1,
        },
        latency: Duration::ZERO,
    })
    .expect("builds")
}

/// The body of an answer, parsed.
pub(crate) fn body(answer: Answer<'_>) -> Json {
    let bytes = match answer {
        Answer::Page { head, items, tail } => [&head[..], items, &tail[..]].concat(),
        Answer::Whole(bytes) => bytes,
    };
    let end = find_head_end(&bytes).expect("head");
    let head = std::str::from_utf8(&bytes[..end]).expect("utf-8");
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .and_then(|l| l.trim().parse().ok())
        .expect("content length");
    assert_eq!(length, bytes.len() - end, "Content-Length matches the body");
    serde_json::from_slice(&bytes[end..]).expect("body is JSON")
}

fn scan(server: &Server, request: Json) -> Json {
    body(server.answer(
        Some("DynamoDB_20120810.Scan"),
        request.to_string().as_bytes(),
    ))
}

/// Every item of every segment, read page by page like a client would.
fn read_all(server: &Server, total: u32, limit: Option<u32>) -> Vec<String> {
    let mut keys = Vec::new();
    for segment in 0..total {
        let mut start: Option<Json> = None;
        loop {
            let mut request =
                json!({"TableName": "bench", "Segment": segment, "TotalSegments": total});
            if let Some(limit) = limit {
                request["Limit"] = json!(limit);
            }
            if let Some(key) = start.take() {
                request["ExclusiveStartKey"] = key;
            }
            let page = scan(server, request);
            let items = page["Items"].as_array().expect("items");
            assert_eq!(page["Count"], json!(items.len()));
            keys.extend(
                items
                    .iter()
                    .map(|i| i["pk"]["S"].as_str().expect("pk").to_string()),
            );
            match page.get("LastEvaluatedKey") {
                Some(key) => start = Some(key.clone()),
                None => break,
            }
        }
    }
    keys
}

#[test]
fn segments_and_pages_cover_every_item_once() {
    let server = server(2503, 4, 100);
    let expected: Vec<String> = (0..2503).map(items::partition_key).collect();
    assert_eq!(read_all(&server, 4, None), expected, "pre-built pages");
    assert_eq!(
        read_all(&server, 3, Some(77)),
        expected,
        "pages built on the fly"
    );
}

#[test]
fn pages_report_consumed_capacity() {
    let server = server(10, 1, 100);
    let page = scan(&server, json!({"TableName": "bench"}));
    assert_eq!(page["Count"], json!(10));
    assert!(page.get("LastEvaluatedKey").is_none());
    assert_eq!(page["ConsumedCapacity"]["TableName"], "bench");
    assert!(
        page["ConsumedCapacity"]["CapacityUnits"]
            .as_f64()
            .expect("units")
            >= 0.5
    );
}

#[test]
fn an_empty_segment_is_one_empty_page() {
    let server = server(2, 4, 100);
    let page = scan(
        &server,
        json!({"TableName": "bench", "Segment": 0, "TotalSegments": 4}),
    );
    assert_eq!(page["Items"], json!([]));
    assert!(page.get("LastEvaluatedKey").is_none());
}

#[test]
fn bad_requests_are_validation_errors() {
    let server = server(10, 2, 100);
    let foreign = json!({"TableName": "bench", "Segment": 0, "TotalSegments": 2,
                         "ExclusiveStartKey": items::key_json(9)});
    assert!(
        scan(&server, foreign)["__type"]
            .as_str()
            .expect("type")
            .ends_with("ValidationException")
    );
    let other = body(server.answer(Some("DynamoDB_20120810.Query"), b"{}"));
    assert!(
        other["__type"]
            .as_str()
            .expect("type")
            .ends_with("UnknownOperationException")
    );
}

#[test]
fn request_heads_are_parsed_case_insensitively() {
    let head = parse_head(
        b"POST / HTTP/1.1\r\ncontent-length: 12\r\nX-Amz-Target: DynamoDB_20120810.Scan\r\nConnection: close\r\n\r\n",
    )
    .expect("parses");
    assert_eq!(head.content_length, 12);
    assert_eq!(head.target.as_deref(), Some("DynamoDB_20120810.Scan"));
    assert!(head.close);
    assert!(parse_head(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n").is_err());
}

#[test]
fn the_bench_table_is_served_under_its_name_and_every_bench_dash_name() {
    for name in ["bench", "bench-00", "bench-49", "bench-orders"] {
        assert!(served(name), "{name}");
    }
    for name in ["bench-", "benchmark", "orders", ""] {
        assert!(!served(name), "{name}");
    }
    let server = server(10, 1, 5);
    let described = body(server.describe(br#"{"TableName":"bench-07"}"#));
    assert_eq!(described["Table"]["TableName"], "bench-07");
    assert_eq!(
        described["Table"]["TableArn"],
        "arn:aws:dynamodb:us-east-1:000000000000:table/bench-07"
    );
    let missing = body(server.describe(br#"{"TableName":"orders"}"#));
    assert!(
        missing["__type"]
            .as_str()
            .is_some_and(|kind| kind.ends_with("ResourceNotFoundException")),
        "{missing}"
    );
}
