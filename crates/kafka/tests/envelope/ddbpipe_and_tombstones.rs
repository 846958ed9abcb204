//! Rules 3 and 4: the ddbpipe value and tombstones.

use super::*;

#[test]
fn the_ddbpipe_value_is_the_line_itself() {
    let new = order(n("7"), "12.5");
    let item = item_line(&new, ValueFormat::Typed);
    let items = shaper(EnvelopeKind::Ddbpipe, Records::Items, false);
    assert_eq!(messages(&items, &item)[0].value.as_deref(), Some(&item[..]));
    let envelopes = shaper(EnvelopeKind::Ddbpipe, Records::Envelopes, false);
    for line in [
        change_line(
            &record(Some("INSERT"), None, Some(new.clone()), None),
            ValueFormat::Plain,
        ),
        change_line(
            &record(Some("REMOVE"), Some(new.clone()), None, Some(ttl())),
            ValueFormat::Plain,
        ),
        snapshot_line(&new, KeyType::N, ValueFormat::Plain),
    ] {
        let out = messages(&envelopes, &line);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].value.as_deref(), Some(&line[..]));
        assert_eq!(out[0].key, br#"{"customer":"c1","order_id":7}"#);
    }
}

#[test]
fn a_delete_is_followed_by_a_tombstone_only_when_asked() {
    let old = order(n("7"), "10");
    let remove = change_line(
        &record(Some("REMOVE"), Some(old.clone()), None, None),
        ValueFormat::Plain,
    );
    for envelope in [EnvelopeKind::Debezium, EnvelopeKind::Ddbpipe] {
        let with = messages(&shaper(envelope, Records::Envelopes, true), &remove);
        assert_eq!(with.len(), 2, "{envelope:?}");
        assert!(with[0].value.is_some());
        assert_eq!(
            with[1],
            Message {
                key: br#"{"customer":"c1","order_id":7}"#.to_vec(),
                value: None
            }
        );
        let without = messages(&shaper(envelope, Records::Envelopes, false), &remove);
        assert_eq!(without.len(), 1, "{envelope:?}");
        assert_eq!(without[0], with[0]);
    }
}

#[test]
fn no_other_op_gets_a_tombstone() {
    let old = order(n("7"), "10");
    let new = order(n("7"), "12.5");
    let envelopes = shaper(EnvelopeKind::Debezium, Records::Envelopes, true);
    for line in [
        change_line(
            &record(Some("INSERT"), None, Some(new.clone()), None),
            ValueFormat::Plain,
        ),
        change_line(
            &record(Some("MODIFY"), Some(old), Some(new.clone()), None),
            ValueFormat::Plain,
        ),
        snapshot_line(&new, KeyType::N, ValueFormat::Plain),
    ] {
        let out = messages(&envelopes, &line);
        assert_eq!(out.len(), 1, "{}", String::from_utf8_lossy(&line));
        assert!(out[0].value.is_some());
    }
    let items = shaper(EnvelopeKind::Debezium, Records::Items, true);
    assert_eq!(
        messages(&items, &item_line(&new, ValueFormat::Plain)).len(),
        1
    );
}
