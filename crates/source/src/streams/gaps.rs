//! Start-up gap detection (docs/streams.md §4.5) and the texts of `on_gap` (docs/streams.md §4.6).
//!
//! A *gap* is a change the stored position can no longer deliver. Detection is skipped on the
//! first run; on a later run it happens after resolving the ARN and discovering the shards,
//! before pruning and admission.
//!
//! # Layers
//! A later layer runs only when the earlier ones found no reason.
//! 1. The stored `stream_arn` differs from the current one (stream re-created) → exactly one
//!    reason, and nothing else is reported. A position without a stored ARN has nothing to
//!    compare and passes.
//! 2. Expiry. Every stored shard (positioned or `""`) that is not described → "shard <id>
//!    expired before it was fully read". Every described shard with no entry whose parent is
//!    neither described, stored nor finished → "shard <id>'s parent <p> expired unread".
//!    Finished shards that are no longer described are not a gap: they are pruned.
//! 3. Staleness of shards stored `""`. Without `verified_at` → one warning listing them (not
//!    a gap). With `now − verified_at > 82 800 s` (23 h; exactly 23 h is not stale) → "shard
//!    <id> was last read <whole hours>h ago with nothing to read; records written since may
//!    have been trimmed".
//! 4. Every positioned, described shard is probed with `GetShardIterator
//!    (AFTER_SEQUENCE_NUMBER, seq)`; [`check`] lists the probes and the caller runs them. A
//!    probe answered `TrimmedDataAccessException` → [`trimmed`].
//!
//! Reasons and warnings come in id order within a layer.
//!
//! # Error handling
//! With `on_gap: fail` the run stops with [`cannot_resume`]. A trim met while reading always
//! fails the run with [`trimmed_while_reading`]; the next start-up applies `on_gap`.

use crate::ids::{SequenceNumber, ShardId};
use crate::position::{ShardProgress, StreamsPosition};
use crate::streams::lineage::ShardGraph;

/// How long a shard stored `""` may go unverified before records written since may have been
/// trimmed, in seconds (23 h: an hour of margin under the 24 h retention).
pub const STALE_AFTER_SECS: i64 = 82_800;

/// What start-up gap detection found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Findings {
    /// Why the position cannot be resumed without losing changes; empty when it can.
    pub reasons: Vec<String>,
    /// Things to log that are not a gap.
    pub warnings: Vec<String>,
    /// Positioned, described shards to probe with `GetShardIterator(AFTER_SEQUENCE_NUMBER)`
    /// (layer 4); filled only when layers 1–3 found no reason.
    pub probes: Vec<(ShardId, SequenceNumber)>,
}

impl Findings {
    /// Whether layers 1–3 found a gap.
    pub fn is_gap(&self) -> bool {
        !self.reasons.is_empty()
    }
}

/// Layer 1 alone: why the position belongs to another stream than `current_arn`, if it does.
pub fn recreated(stored: &StreamsPosition, current_arn: &str, table: &str) -> Option<String> {
    let old = stored.stream_arn.as_deref()?;
    (old != current_arn).then(|| {
        format!(
            "the position belongs to stream {old} but table '{table}' now has stream {current_arn}"
        )
    })
}

/// Layer 3 for one shard with nothing read, verified at `verified_s` (unix s): why records
/// written since may have been trimmed by `now_s`, when more than [`STALE_AFTER_SECS`] passed.
pub fn stale_since(shard: &ShardId, verified_s: i64, now_s: i64) -> Option<String> {
    let since = now_s.saturating_sub(verified_s);
    (since > STALE_AFTER_SECS).then(|| {
        let hours = since / 3600;
        format!(
            "shard {shard} was last read {hours}h ago with nothing to read; records written \
             since may have been trimmed"
        )
    })
}

/// Layer 2's second half: every described shard `known` does not hold whose parent is
/// neither described nor known, with that parent, in id order.
pub fn orphans(graph: &ShardGraph, known: impl Fn(&ShardId) -> bool) -> Vec<(&ShardId, &ShardId)> {
    graph
        .ids()
        .filter(|id| !known(id))
        .filter_map(|id| {
            let parent = graph.get(id)?.parent.as_ref()?;
            (!graph.contains(parent) && !known(parent)).then_some((id, parent))
        })
        .collect()
}

/// [`orphans`] as layer 2 says them: "shard <id>'s parent <p> expired unread".
pub fn expired_parents(graph: &ShardGraph, known: impl Fn(&ShardId) -> bool) -> Vec<String> {
    orphans(graph, known)
        .into_iter()
        .map(|(id, parent)| format!("shard {id}'s parent {parent} expired unread"))
        .collect()
}

/// Layer 3: shards with nothing read whose retention may have run out.
fn stale(stored: &StreamsPosition, now_s: i64, findings: &mut Findings) {
    let mut unverified = Vec::new();
    for (id, verified_at) in empty_shards(stored) {
        match verified_at {
            None => unverified.push(id.as_str()),
            Some(at) => findings.reasons.extend(stale_since(id, at, now_s)),
        }
    }
    if !unverified.is_empty() {
        findings.warnings.push(format!(
            "shards with nothing read and no verified_at cannot be checked for trimmed \
             records: {}",
            unverified.join(", ")
        ));
    }
}

/// Layers 1–3 and the list of layer-4 probes, for a later start-up. `table` is the configured
/// table name; `now_s` is unix seconds.
pub fn check(
    stored: &StreamsPosition,
    current_arn: &str,
    graph: &ShardGraph,
    table: &str,
    now_s: i64,
) -> Findings {
    let mut findings = Findings::default();

    // Layer 1: the stream was re-created.
    if let Some(reason) = recreated(stored, current_arn, table) {
        findings.reasons.push(reason);
        return findings;
    }

    // Layer 2: shards, or parents of new shards, expired before they were read.
    for (id, _) in stored.open_shards().filter(|(id, _)| !graph.contains(id)) {
        findings
            .reasons
            .push(format!("shard {id} expired before it was fully read"));
    }
    findings
        .reasons
        .extend(expired_parents(graph, |id| stored.knows(id)));
    if findings.is_gap() {
        return findings;
    }

    // Layer 3: shards with nothing read whose retention may have run out.
    stale(stored, now_s, &mut findings);
    if findings.is_gap() {
        return findings;
    }

    // Layer 4: the caller probes every positioned, described shard.
    findings.probes = probes(stored, graph);
    findings
}

/// Every positioned, described shard with its stored sequence number, in id order: the layer-4
/// probes. Resnapshot probes these even when an earlier layer found the gap (docs/streams.md §4.7).
pub fn probes(stored: &StreamsPosition, graph: &ShardGraph) -> Vec<(ShardId, SequenceNumber)> {
    stored
        .shards
        .iter()
        .filter(|(id, _)| graph.contains(id))
        .filter_map(|(id, progress)| match progress {
            ShardProgress::After(seq) => Some((id.clone(), seq.clone())),
            ShardProgress::TrimHorizon { .. } | ShardProgress::ShardEnd { .. } => None,
        })
        .collect()
}

/// The shards at their trim horizon (stored `""`) with their `verified_at`, in id order.
fn empty_shards(stored: &StreamsPosition) -> impl Iterator<Item = (&ShardId, Option<i64>)> {
    stored
        .shards
        .iter()
        .filter_map(|(id, progress)| match progress {
            ShardProgress::TrimHorizon { verified_at, .. } => Some((id, *verified_at)),
            _ => None,
        })
}

/// The layer-4 reason for a probe answered `TrimmedDataAccessException`.
pub fn trimmed(shard: &ShardId, seq: &SequenceNumber) -> String {
    format!("shard {shard} was trimmed past sequence {seq}")
}

/// The `on_gap: fail` error text (docs/streams.md §4.6). Its remedy — `on_gap: resnapshot`,
/// or forgetting the position — is the caller's to word: a command names its pipeline file.
pub fn cannot_resume(table: &str, reasons: &[String]) -> String {
    format!(
        "cannot resume table '{table}' without losing changes: {}",
        reasons.join("; ")
    )
}

/// What the error of a gap met while reading tells the user to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GapRemedy {
    /// One process: `on_gap` applies at the next start-up (docs/streams.md §4.6).
    OnGap,
    /// A worker of a shared stream or mirror, whose `on_gap` is `fail` (docs/coordination.md
    /// §11.11, §11.12): reset once no worker runs, then start the workers again.
    StateReset,
}

/// The error text of a trim met while reading (docs/streams.md §4.6), whatever `on_gap` says,
/// with `remedy`.
pub fn trimmed_while_reading(shard: &ShardId, remedy: GapRemedy) -> String {
    format!(
        "shard {shard} was trimmed past the position being read (changes older than the 24 h \
         retention are lost); {}",
        remedy.what()
    )
}

/// The error text of gaps a worker of a shared stream finds before reading (its leader's
/// listing, a row it takes: docs/coordination.md §11.11): the layers' `reasons`, with `remedy`.
pub fn found_before_reading(reasons: &[String], remedy: GapRemedy) -> String {
    format!(
        "cannot read the stream without losing changes: {}; {}",
        reasons.join("; "),
        remedy.what()
    )
}

/// The gap of an error text made with `remedy` ([`trimmed_while_reading`],
/// [`found_before_reading`]), without the remedy: what a shared mirror that mends the gap
/// itself keeps as the reason.
pub fn without_remedy(message: &str, remedy: GapRemedy) -> &str {
    message
        .strip_suffix(remedy.what())
        .and_then(|gap| gap.strip_suffix("; "))
        .unwrap_or(message)
}

impl GapRemedy {
    /// What the user does about a gap.
    fn what(self) -> &'static str {
        match self {
            GapRemedy::OnGap => "set on_gap: resnapshot or reset the position",
            GapRemedy::StateReset => {
                "a shared pipeline stops on a gap: run `ddbpipe state reset` once no worker \
                 runs, then start the workers again (a mirror takes a new snapshot)"
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::api::ShardDescription;
    use crate::position::StreamKind;

    use super::*;

    const ARN: &str = "arn:aws:dynamodb:eu-west-1:1:table/orders/stream/2026-10-01T00:00:00.000";
    const NEW_ARN: &str =
        "arn:aws:dynamodb:eu-west-1:1:table/orders/stream/2026-10-02T00:00:00.000";
    const NOW: i64 = 1_767_225_600;

    fn id(s: &str) -> ShardId {
        ShardId::new(s)
    }

    fn seq(s: &str) -> SequenceNumber {
        SequenceNumber::parse(s).unwrap()
    }

    fn graph(shards: &[(&str, Option<&str>)]) -> ShardGraph {
        let mut graph = ShardGraph::new();
        graph.merge(shards.iter().map(|(s, p)| ShardDescription {
            id: id(s),
            parent: p.map(id),
            closed: false,
        }));
        graph
    }

    fn stored() -> StreamsPosition {
        StreamsPosition::new(StreamKind::Streams, Some(ARN.into()))
    }

    fn positioned(position: &mut StreamsPosition, shard: &str, at: &str) {
        position.advance(&id(shard), &seq(at));
    }

    fn check_now(stored: &StreamsPosition, graph: &ShardGraph) -> Findings {
        check(stored, ARN, graph, "orders", NOW)
    }

    #[test]
    fn a_stored_arn_other_than_the_tables_is_the_only_reason() {
        let mut position = stored();
        position.admit(&id("gone"), Some(0), None);
        position.admit(&id("unverified"), None, None);
        positioned(&mut position, "s1", "5");
        let findings = check(
            &position,
            NEW_ARN,
            &graph(&[("s1", None), ("unverified", None)]),
            "orders",
            NOW,
        );
        assert_eq!(
            findings.reasons,
            vec![format!(
                "the position belongs to stream {ARN} but table 'orders' now has stream {NEW_ARN}"
            )]
        );
        assert!(findings.warnings.is_empty() && findings.probes.is_empty());
    }

    #[test]
    fn a_position_without_a_stored_arn_is_not_a_recreated_stream() {
        let mut position = stored();
        position.stream_arn = None;
        positioned(&mut position, "s1", "5");
        let findings = check(&position, NEW_ARN, &graph(&[("s1", None)]), "orders", NOW);
        assert!(!findings.is_gap());
        assert_eq!(findings.probes, vec![(id("s1"), seq("5"))]);
    }

    #[test]
    fn a_stored_shard_that_is_not_described_expired_before_it_was_fully_read() {
        let mut position = stored();
        positioned(&mut position, "a", "5");
        position.admit(&id("b"), Some(NOW), None);
        positioned(&mut position, "c", "9");
        let findings = check_now(&position, &graph(&[("c", None)]));
        assert_eq!(
            findings.reasons,
            vec![
                "shard a expired before it was fully read",
                "shard b expired before it was fully read",
            ]
        );
        assert!(findings.probes.is_empty(), "no probes once a gap is found");
    }

    #[test]
    fn a_new_shard_whose_parent_vanished_unread_is_a_gap() {
        let findings = check_now(&stored(), &graph(&[("c", Some("p"))]));
        assert_eq!(findings.reasons, vec!["shard c's parent p expired unread"]);
    }

    #[test]
    fn a_new_shard_whose_parent_is_described_stored_or_finished_is_not_a_gap() {
        let mut position = stored();
        position.finish(&id("done"), Some(NOW));
        let described = graph(&[("p", None), ("c1", Some("p")), ("c2", Some("done"))]);
        assert!(!check_now(&position, &described).is_gap());
    }

    #[test]
    fn a_stored_parent_that_expired_is_reported_once_not_through_its_child() {
        let mut position = stored();
        positioned(&mut position, "p", "5");
        let findings = check_now(&position, &graph(&[("c", Some("p"))]));
        assert_eq!(
            findings.reasons,
            vec!["shard p expired before it was fully read"]
        );
    }

    #[test]
    fn a_shard_with_an_entry_is_not_checked_for_its_parent() {
        let mut position = stored();
        positioned(&mut position, "c", "5");
        let findings = check_now(&position, &graph(&[("c", Some("gone"))]));
        assert!(!findings.is_gap());
    }

    #[test]
    fn finished_shards_that_are_not_described_are_not_a_gap() {
        let mut position = stored();
        position.finish(&id("old"), Some(0));
        let findings = check_now(&position, &graph(&[("new", None)]));
        assert!(!findings.is_gap());
        assert!(findings.warnings.is_empty());
    }

    #[test]
    fn staleness_is_not_checked_once_a_shard_expired() {
        let mut position = stored();
        positioned(&mut position, "gone", "5");
        position.admit(&id("stale"), Some(NOW - 2 * 86_400), None);
        position.admit(&id("unverified"), None, None);
        let findings = check_now(&position, &graph(&[("stale", None), ("unverified", None)]));
        assert_eq!(
            findings.reasons,
            vec!["shard gone expired before it was fully read"]
        );
        assert!(findings.warnings.is_empty());
    }

    #[test]
    fn shards_without_verified_at_give_one_warning_that_is_not_a_gap() {
        let mut position = stored();
        position.admit(&id("s2"), None, None);
        position.admit(&id("s1"), None, None);
        positioned(&mut position, "s3", "7");
        let findings = check_now(
            &position,
            &graph(&[("s1", None), ("s2", None), ("s3", None)]),
        );
        assert!(!findings.is_gap());
        assert_eq!(findings.warnings.len(), 1);
        assert!(findings.warnings[0].ends_with(": s1, s2"), "{findings:?}");
        assert_eq!(findings.probes, vec![(id("s3"), seq("7"))]);
    }

    #[test]
    fn exactly_23_hours_is_not_stale() {
        let mut position = stored();
        position.admit(&id("s1"), Some(NOW - STALE_AFTER_SECS), None);
        let findings = check_now(&position, &graph(&[("s1", None)]));
        assert!(!findings.is_gap() && findings.warnings.is_empty());
    }

    #[test]
    fn one_second_past_23_hours_is_stale_in_whole_hours() {
        let mut position = stored();
        position.admit(&id("s1"), Some(NOW - STALE_AFTER_SECS - 1), None);
        let findings = check_now(&position, &graph(&[("s1", None)]));
        assert_eq!(
            findings.reasons,
            vec![
                "shard s1 was last read 23h ago with nothing to read; records written since \
                 may have been trimmed"
            ]
        );
    }

    #[test]
    fn a_shard_verified_24_hours_ago_was_last_read_24h_ago() {
        let mut position = stored();
        position.admit(&id("s1"), Some(NOW - 24 * 3600), None);
        positioned(&mut position, "s2", "5");
        let findings = check_now(&position, &graph(&[("s1", None), ("s2", None)]));
        assert_eq!(findings.reasons.len(), 1);
        assert!(findings.reasons[0].starts_with("shard s1 was last read 24h ago"));
        assert!(findings.probes.is_empty(), "no probes once a gap is found");
    }

    #[test]
    fn only_positioned_described_shards_are_probed() {
        let mut position = stored();
        positioned(&mut position, "b", "20");
        positioned(&mut position, "a", "5");
        position.admit(&id("empty"), Some(NOW), None);
        position.finish(&id("done"), Some(NOW));
        let described = graph(&[("a", None), ("b", None), ("empty", None), ("done", None)]);
        let findings = check_now(&position, &described);
        assert!(!findings.is_gap() && findings.warnings.is_empty());
        assert_eq!(
            findings.probes,
            vec![(id("a"), seq("5")), (id("b"), seq("20"))]
        );
        // Resnapshot probes the described ones even when the shard list has a gap.
        positioned(&mut position, "gone", "1");
        assert!(check_now(&position, &described).probes.is_empty());
        assert_eq!(probes(&position, &described).len(), 2);
    }

    #[test]
    fn a_trimmed_probe_names_the_shard_and_the_sequence() {
        assert_eq!(
            trimmed(&id("s1"), &seq("5")),
            "shard s1 was trimmed past sequence 5"
        );
    }

    #[test]
    fn the_on_gap_fail_text_joins_the_reasons() {
        let reasons = vec![
            trimmed(&id("s1"), &seq("5")),
            "shard s2 expired".to_string(),
        ];
        assert_eq!(
            cannot_resume("orders", &reasons),
            "cannot resume table 'orders' without losing changes: shard s1 was trimmed past \
             sequence 5; shard s2 expired"
        );
    }

    #[test]
    fn a_gap_found_before_reading_joins_the_reasons_and_names_the_remedy() {
        let reasons = vec![
            "shard c's parent p expired unread".to_string(),
            "shard d's parent q expired unread".to_string(),
        ];
        assert_eq!(
            found_before_reading(&reasons, GapRemedy::StateReset),
            "cannot read the stream without losing changes: shard c's parent p expired unread; \
             shard d's parent q expired unread; a shared pipeline stops on a gap: run `ddbpipe \
             state reset` once no worker runs, then start the workers again (a mirror takes a \
             new snapshot)"
        );
        let told = found_before_reading(&reasons, GapRemedy::StateReset);
        assert_eq!(
            without_remedy(&told, GapRemedy::StateReset),
            "cannot read the stream without losing changes: shard c's parent p expired unread; \
             shard d's parent q expired unread"
        );
        let other = trimmed_while_reading(&id("s1"), GapRemedy::OnGap);
        assert_eq!(
            without_remedy(&other, GapRemedy::StateReset),
            other,
            "another remedy stays"
        );
    }

    #[test]
    fn a_trim_while_reading_names_the_shard() {
        assert_eq!(
            trimmed_while_reading(&id("s1"), GapRemedy::OnGap),
            "shard s1 was trimmed past the position being read (changes older than the 24 h \
             retention are lost); set on_gap: resnapshot or reset the position"
        );
    }
}
