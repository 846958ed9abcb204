//! The kafka sink's section: its defaults, secrets, rules and MSK IAM.

use super::*;

#[test]
fn the_kafka_sink_is_read_with_its_defaults_and_its_secrets_hidden() {
    let config = parse_ok(
        "name: orders-cdc\nsource: {table_name: orders, mode: streams, follow: true}\n\
         sink: {type: kafka, brokers: 'k1:9092,k2:9092', properties: {sasl.password: hunter22, \
         compression.type: zstd}}\n",
    );
    let SinkConfig::Kafka(kafka) = &config.sink else {
        panic!("a kafka sink");
    };
    assert_eq!(kafka.brokers, "k1:9092,k2:9092");
    assert_eq!(kafka.topic, "dynamodb.{table}");
    assert_eq!(kafka.positions_topic, "_ddbpipe_positions");
    assert_eq!(kafka.delivery, ddbpipe_kafka::client::Delivery::ExactlyOnce);
    assert_eq!(
        kafka.envelope,
        ddbpipe_kafka::envelope::EnvelopeKind::Debezium
    );
    assert!(kafka.tombstones);
    assert_eq!(config.sink.keeps_position(), Some("its positions topic"));
    // A transaction per batch: larger batches by default; exactly once never splits a page.
    assert_eq!(config.source.batch_size, 5000);
    assert!(config.source.whole_pages);
    let at_least_once = parse_ok(
        "name: t\nsource: {table_name: o, batch_size: 10}\n\
         sink: {type: kafka, brokers: 'k:1', delivery: at_least_once}\n",
    );
    assert_eq!(at_least_once.source.batch_size, 10);
    assert!(!at_least_once.source.whole_pages);
    // The lake sinks commit each batch's position with its files and append: a resumed scan
    // must not write a committed page's first items again.
    for lake in [
        "{type: parquet, path: lake}",
        "{type: iceberg, catalog: {type: sql, uri: 'sqlite:///c.db'}, warehouse: wh}",
    ] {
        let config = parse_ok(&format!(
            "name: t\nsource: {{table_name: o, batch_size: 10}}\nsink: {lake}\n"
        ));
        assert!(config.source.whole_pages, "{lake}");
    }
    let keyed = parse_ok("name: t\nsource: {table_name: o}\nsink: {type: sqlite, path: o.db}\n");
    assert!(
        !keyed.source.whole_pages,
        "a keyed sink upserts a page sent again"
    );
    assert_eq!(
        crate::sinks::kafka::topic_name(kafka, config.target()),
        "dynamodb.orders"
    );
    assert!(!format!("{config:?}").contains("hunter22"));
    // A property that is not a string names its kind, never its value.
    let said = errors(
        "name: t\nsource: {table_name: o}\n\
         sink: {type: kafka, brokers: 'k:1', properties: {sasl.password: [hunter22]}}\n",
    );
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(
        said[0].starts_with("config error: sink.properties.sasl.password:"),
        "{said:?}"
    );
    assert!(!said[0].contains("hunter22"), "{said:?}");
}

/// `msk_iam` (docs/sinks.md §7.7 rule 4): SASL OAUTHBEARER over SASL_SSL unless
/// SASL_PLAINTEXT is asked; what would authenticate otherwise is refused beside it, and
/// OAUTHBEARER without it, whatever the delivery (ddbpipe answers every token refresh).
#[test]
fn msk_iam_authenticates_with_its_tokens_and_nothing_else() {
    let file = |sink: &str| {
        format!(
            "name: t\nsource: {{table_name: o, mode: streams, follow: true}}\n\
             sink: {{type: kafka, brokers: 'b-1.msk:9098', {sink}}}\n"
        )
    };
    let kafka = |config: PipelineConfig| match config.sink {
        SinkConfig::Kafka(kafka) => kafka,
        other => panic!("{other:?}"),
    };
    let defaults = kafka(parse_ok(&file("msk_iam: {}")));
    assert_eq!(defaults.msk_iam.as_ref().unwrap().region, None);
    assert_eq!(
        defaults.client_properties(),
        [
            ("security.protocol".to_string(), "SASL_SSL".to_string()),
            ("sasl.mechanism".to_string(), "OAUTHBEARER".to_string())
        ]
    );
    let plaintext = kafka(parse_ok(&file(
        "msk_iam: {region: eu-west-1}, properties: {security.protocol: SASL_PLAINTEXT}",
    )));
    assert_eq!(
        plaintext.msk_iam.unwrap().region.as_deref(),
        Some("eu-west-1")
    );
    assert!(
        (plaintext.properties.get("security.protocol"))
            .is_some_and(|p| p.expose() == "SASL_PLAINTEXT")
    );
    parse_ok(&file(
        "delivery: at_least_once, msk_iam: {}, properties: {compression.type: zstd}",
    ));
    for (sink, said) in [
        (
            "msk_iam: {}, properties: {sasl.mechanism: SCRAM-SHA-512}",
            "config error: sink.properties.sasl.mechanism: msk_iam authenticates with its own \
             OAUTHBEARER tokens",
        ),
        (
            "msk_iam: {}, properties: {sasl.username: u}",
            "config error: sink.properties.sasl.username: msk_iam authenticates",
        ),
        (
            "msk_iam: {}, properties: {security.protocol: SSL}",
            "config error: sink.properties.security.protocol: msk_iam authenticates over SASL",
        ),
        ("msk_iam: {regoin: x}", "config error: sink.msk_iam.regoin:"),
        (
            "properties: {security.protocol: SASL_SSL, sasl.mechanism: OAUTHBEARER}",
            "config error: sink.properties.sasl.mechanism: OAUTHBEARER tokens come from \
             sink.msk_iam",
        ),
        (
            "delivery: at_least_once, properties: {sasl.mechanism: oauthbearer}",
            "config error: sink.properties.sasl.mechanism: OAUTHBEARER tokens come from",
        ),
    ] {
        let found = errors(&file(sink));
        assert!(
            found.iter().any(|line| line.starts_with(said)),
            "{sink}: {found:?}"
        );
        assert_eq!(found.len(), 1, "one problem, said once: {found:?}");
    }
}

#[test]
fn the_kafka_rules_name_the_field() {
    let file = |sink: &str| {
        format!(
            "name: t\nsource: {{table_name: o, mode: streams, follow: true}}\nsink: {{type: kafka, {sink}}}\n"
        )
    };
    for (sink, said) in [
        (
            "brokers: ''",
            "config error: sink.brokers: brokers must not be empty",
        ),
        (
            "brokers: 'k1'",
            "config error: sink.brokers: 'k1' is not host:port",
        ),
        (
            "brokers: 'k:1', topic: 'a/{table}'",
            "config error: sink.topic: 'a/{table}' holds '/'",
        ),
        (
            "brokers: 'k:1', topic: t, positions_topic: t",
            "config error: sink.positions_topic: the positions topic must not be the topic",
        ),
        (
            "brokers: 'k:1', properties: {acks: '1'}",
            "config error: sink.properties.acks: ddbpipe sets this property itself",
        ),
        (
            "brokers: 'k:1', properties: {security.protocol: SASL_SSL}",
            "config error: sink.properties.sasl.mechanism: ddbpipe reads the positions back \
             with PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or MSK IAM (sink.msk_iam), not GSSAPI",
        ),
        (
            "brokers: 'k:1', properties: {security.protocol: SASL_PLAINTEXT, \
             sasl.mechanism: SCRAM-SHA-512, sasl.username: u}",
            "config error: sink.properties.sasl.password: required with sasl.mechanism \
             SCRAM-SHA-512",
        ),
        (
            "brokers: 'k:1', properties: {security.protocol: ssl, ssl.ca.location: /nonexistent/ca.pem}",
            "config error: sink.properties.ssl.ca.location: the file cannot be read",
        ),
        (
            "brokers: 'k:1', properties: {security.protocol: SSL, \
             enable.ssl.certificate.verification: 'false'}",
            "config error: sink.properties: ddbpipe reads its positions only from a broker whose \
             certificate and name it verified",
        ),
        (
            "brokers: 'k:1', properties: {security.protocol: SSL, ssl.key.location: k.pem}",
            "config error: sink.properties: a client certificate needs both",
        ),
        (
            "brokers: 'k:1', topic_config: {replication_factor: 0}",
            "config error: sink.topic_config.replication_factor:",
        ),
        (
            "brokers: 'k:1', delivery: eos",
            "exactly once is `delivery: exactly_once`",
        ),
    ] {
        let found = errors(&file(sink));
        assert!(
            found
                .iter()
                .any(|line| line.starts_with(said) || line.contains(said)),
            "{sink}: {found:?}"
        );
    }
    // at_least_once over SASL_SSL is fine, exactly_once over TLS with the Mozilla roots too;
    // exactly_once keeps no state file.
    parse_ok(&file(
        "brokers: 'k:1', delivery: at_least_once, properties: {security.protocol: SASL_SSL}",
    ));
    parse_ok(&file(
        "brokers: 'k:1', properties: {security.protocol: SSL}",
    ));
    parse_ok(&file(
        "brokers: 'k:1', properties: {security.protocol: SASL_SSL, sasl.mechanism: PLAIN, \
         sasl.username: u, sasl.password: p}",
    ));
    assert_eq!(
        errors(
            "name: t\nsource: {table_name: o, mode: streams, follow: true}\n\
             sink: {type: kafka, brokers: 'k:1'}\nstate: {path: s.json}\n"
        ),
        [
            "config error: state.path: the kafka sink keeps the position in its positions topic; \
          remove state.path"
        ]
    );
    // Several workers write one topic (docs/coordination.md §11.13); a shared mirror keeps its
    // snapshot record in a destination database, which Kafka is not.
    parse_ok(
        "name: t\nsource: {table_name: o, mode: streams, follow: true}\n\
         sink: {type: kafka, brokers: 'k:1'}\ncoordination: {lease_table: leases}\n",
    );
    assert_eq!(
        errors(
            "name: t\nsource: {table_name: o, mode: mirror, follow: true}\n\
             sink: {type: kafka, brokers: 'k:1'}\ncoordination: {lease_table: l}\n"
        )
        .iter()
        .filter(|line| line.starts_with("config error: coordination: a mirror shared by several"))
        .count(),
        1
    );
}
