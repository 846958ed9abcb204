//! The shard graph of a stream and which of its shards may be admitted now (docs/streams.md §4.8).
//!
//! Pure decisions: data in, decision out. The shard syncer merges each discovery into a
//! [`ShardGraph`]; the scheduler asks [`admissible`] after every discovery and every drained
//! shard, and records each admission in the position as `""`.
//!
//! # Graph
//! 1. A shard is known by its id; the first description of an id adds it.
//! 2. A later description of a known id never removes information: `closed` stays true once
//!    seen (a shard never reopens) and a missing parent is filled in, but a known parent is
//!    never replaced.
//!
//! # Ordering (`WaitingOnParentShards`)
//! 1. A shard is *ready* when it is described, not known to the position (neither in `shards`
//!    nor in `finished`), and its parent is absent, finished, or an *orphan*.
//! 2. An orphan parent is neither described nor known to the position: it was trimmed before
//!    we came, so its child is a root. Mid-run the caller warns; at a later start-up `gaps`
//!    reports it as a gap before admission runs.
//! 3. A parent that is described, or known to the position but unfinished, holds its children
//!    back. A child is therefore never admitted in the same call as its parent: it waits until
//!    the parent is finished (`ShardEnd`).
//! 4. A child of a finished parent inherits the parent's frontier (`verified_at[parent]`) as
//!    its own `verified_at` (docs/streams.md §4.5).
//! 5. Admissions come ordered by ancestry depth (the number of described ancestors), then id,
//!    so the same inputs always give the same order.
//!
//! # Pruning
//! A finished id that is neither described nor the parent of a described shard can unblock
//! nothing: it is dropped from `finished` with its `verified_at` (docs/streams.md §4.6).

use std::collections::{BTreeMap, BTreeSet};

use crate::api::ShardDescription;
use crate::ids::ShardId;
use crate::position::StreamsPosition;

/// The shards of a stream as discovered so far: ids, parents, closed flags.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardGraph {
    shards: BTreeMap<ShardId, ShardDescription>,
    children: BTreeMap<ShardId, BTreeSet<ShardId>>,
}

impl ShardGraph {
    /// A graph with no shard.
    pub fn new() -> Self {
        ShardGraph::default()
    }

    /// Merges a discovery; returns the ids seen for the first time, in the order given (each
    /// once, even when the discovery lists it twice).
    pub fn merge(&mut self, shards: impl IntoIterator<Item = ShardDescription>) -> Vec<ShardId> {
        let mut new = Vec::new();
        for shard in shards {
            match self.shards.get_mut(&shard.id) {
                Some(known) => {
                    known.closed |= shard.closed;
                    if known.parent.is_none()
                        && let Some(parent) = shard.parent
                    {
                        self.children
                            .entry(parent.clone())
                            .or_default()
                            .insert(shard.id.clone());
                        known.parent = Some(parent);
                    }
                }
                None => {
                    if let Some(parent) = &shard.parent {
                        self.children
                            .entry(parent.clone())
                            .or_default()
                            .insert(shard.id.clone());
                    }
                    new.push(shard.id.clone());
                    self.shards.insert(shard.id.clone(), shard);
                }
            }
        }
        new
    }

    /// The description of `id`, if it was discovered.
    pub fn get(&self, id: &ShardId) -> Option<&ShardDescription> {
        self.shards.get(id)
    }

    /// Whether `id` was discovered.
    pub fn contains(&self, id: &ShardId) -> bool {
        self.shards.contains_key(id)
    }

    /// The shard with `closed` trusted only when a successor is listed too. Some emulators
    /// report an ending sequence number on their one open shard; reading a really closed
    /// shard finds nothing more and drains it, so treating it as open is always safe.
    pub fn with_trusted_closed(&self, id: &ShardId) -> Option<ShardDescription> {
        let mut shard = self.get(id)?.clone();
        shard.closed = shard.closed && !self.children_of(id).is_empty();
        Some(shard)
    }

    /// The described shards naming `id` as their parent, sorted by id. `id` itself need not
    /// be described.
    pub fn children_of(&self, id: &ShardId) -> Vec<ShardId> {
        self.children
            .get(id)
            .map(|children| children.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Number of described shards.
    pub fn len(&self) -> usize {
        self.shards.len()
    }

    /// Whether no shard was described.
    pub fn is_empty(&self) -> bool {
        self.shards.is_empty()
    }

    /// The described ids, sorted.
    pub fn ids(&self) -> impl Iterator<Item = &ShardId> {
        self.shards.keys()
    }

    /// The number of described ancestors of `id`. Bounded by the graph's size, so a parent
    /// cycle in malformed input cannot loop.
    fn depth(&self, id: &ShardId) -> usize {
        let mut depth = 0;
        let mut current = id;
        while depth < self.shards.len() {
            match self
                .shards
                .get(current)
                .and_then(|shard| shard.parent.as_ref())
            {
                Some(parent) if self.shards.contains_key(parent) => {
                    depth += 1;
                    current = parent;
                }
                _ => break,
            }
        }
        depth
    }
}

/// A shard that may be admitted now (rule 1): described, not known to the position, and
/// whose parent is absent, finished, or an orphan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    /// The shard to admit.
    pub shard: ShardId,
    /// The parent when it is an orphan (rule 2): the caller warns mid-run; a gap at a later
    /// start-up is detected by `gaps`.
    pub orphan_parent: Option<ShardId>,
    /// The parent when it is finished: its frontier (`ShardEnd { frontier }`) becomes
    /// the child's `verified_at` (rule 4).
    pub finished_parent: Option<ShardId>,
}

impl Admission {
    /// The `verified_at` the shard inherits from its finished parent (rule 4), if any.
    pub fn inherited_verified_at(&self, position: &StreamsPosition) -> Option<i64> {
        self.finished_parent
            .as_ref()
            .and_then(|parent| position.verified_at(parent))
    }
}

/// Shards to admit now, parents before children: a child whose parent is admitted in this
/// same call is not returned; it waits until the parent is finished (rule 3). Ordered by
/// ancestry depth, then id (rule 5).
pub fn admissible(graph: &ShardGraph, position: &StreamsPosition) -> Vec<Admission> {
    let mut ready: Vec<(usize, Admission)> = graph
        .shards
        .values()
        .filter(|shard| !position.knows(&shard.id))
        .filter_map(|shard| {
            let (orphan_parent, finished_parent) = match &shard.parent {
                None => (None, None),
                Some(parent) if position.is_finished(parent) => (None, Some(parent.clone())),
                Some(parent) if !graph.contains(parent) && !position.knows(parent) => {
                    (Some(parent.clone()), None)
                }
                Some(_) => return None,
            };
            let admission = Admission {
                shard: shard.id.clone(),
                orphan_parent,
                finished_parent,
            };
            Some((graph.depth(&shard.id), admission))
        })
        .collect();
    ready.sort_by(|(da, a), (db, b)| da.cmp(db).then_with(|| a.shard.cmp(&b.shard)));
    ready.into_iter().map(|(_, admission)| admission).collect()
}

/// Removes finished shards that are neither described nor the parent of a described shard,
/// with their frontier (docs/streams.md §4.6 "prune").
pub fn prune(graph: &ShardGraph, position: &mut StreamsPosition) {
    let parents: BTreeSet<&ShardId> = graph
        .shards
        .values()
        .filter_map(|shard| shard.parent.as_ref())
        .collect();
    let gone: Vec<ShardId> = position
        .finished()
        .filter(|id| !graph.contains(id) && !parents.contains(id))
        .cloned()
        .collect();
    for id in gone {
        position.forget(&id);
    }
}

#[cfg(test)]
mod tests {
    use crate::ids::SequenceNumber;
    use crate::position::{ShardProgress, StreamKind};

    use super::*;

    fn id(s: &str) -> ShardId {
        ShardId::new(s)
    }

    fn shard(s: &str, parent: Option<&str>, closed: bool) -> ShardDescription {
        ShardDescription {
            id: id(s),
            parent: parent.map(id),
            closed,
        }
    }

    fn graph(shards: &[(&str, Option<&str>)]) -> ShardGraph {
        let mut graph = ShardGraph::new();
        graph.merge(shards.iter().map(|(s, p)| shard(s, *p, false)));
        graph
    }

    fn position() -> StreamsPosition {
        StreamsPosition::new(StreamKind::Streams, Some("arn:s".into()))
    }

    fn ids(admissions: &[Admission]) -> Vec<&str> {
        admissions.iter().map(|a| a.shard.as_str()).collect()
    }

    #[test]
    fn a_merge_returns_the_new_ids_once_in_the_order_given() {
        let mut graph = graph(&[("b", None)]);
        let new = graph.merge([
            shard("d", None, false),
            shard("b", None, false),
            shard("a", Some("b"), false),
            shard("d", None, false),
        ]);
        assert_eq!(new, vec![id("d"), id("a")]);
        assert_eq!(graph.len(), 3);
        assert!(!graph.is_empty() && ShardGraph::new().is_empty());
        assert_eq!(
            graph.ids().collect::<Vec<_>>(),
            vec![&id("a"), &id("b"), &id("d")]
        );
        assert!(graph.contains(&id("a")) && !graph.contains(&id("z")));
    }

    #[test]
    fn a_closed_shard_stays_closed_when_described_open_again() {
        let mut graph = ShardGraph::new();
        graph.merge([shard("a", None, true)]);
        graph.merge([shard("a", None, false)]);
        assert!(graph.get(&id("a")).unwrap().closed);
        graph.merge([shard("b", None, false)]);
        graph.merge([shard("b", None, true)]);
        assert!(graph.get(&id("b")).unwrap().closed);
    }

    #[test]
    fn a_known_parent_is_filled_in_but_never_replaced() {
        let mut graph = graph(&[("c", None)]);
        graph.merge([shard("c", Some("p"), false)]);
        assert_eq!(graph.get(&id("c")).unwrap().parent, Some(id("p")));
        assert_eq!(graph.children_of(&id("p")), vec![id("c")]);
        graph.merge([shard("c", Some("q"), false)]);
        assert_eq!(graph.get(&id("c")).unwrap().parent, Some(id("p")));
        assert!(graph.children_of(&id("q")).is_empty());
    }

    #[test]
    fn children_are_listed_by_id_even_for_an_undescribed_parent() {
        let graph = graph(&[("c2", Some("p")), ("c1", Some("p")), ("x", None)]);
        assert_eq!(graph.children_of(&id("p")), vec![id("c1"), id("c2")]);
        assert!(graph.children_of(&id("x")).is_empty());
        assert!(graph.children_of(&id("nope")).is_empty());
    }

    #[test]
    fn a_described_shard_without_a_parent_is_admissible() {
        let graph = graph(&[("a", None)]);
        let admissions = admissible(&graph, &position());
        assert_eq!(
            admissions,
            vec![Admission {
                shard: id("a"),
                orphan_parent: None,
                finished_parent: None
            }]
        );
    }

    #[test]
    fn a_child_waits_until_its_parent_is_finished() {
        let graph = graph(&[("p", None), ("c", Some("p"))]);
        let mut position = position();
        assert_eq!(ids(&admissible(&graph, &position)), vec!["p"]);
        position.admit(&id("p"), Some(100), None);
        assert!(admissible(&graph, &position).is_empty());
        position.advance(&id("p"), &SequenceNumber::parse("7").unwrap());
        assert!(admissible(&graph, &position).is_empty());
        position.finish(&id("p"), Some(500));
        let admissions = admissible(&graph, &position);
        assert_eq!(ids(&admissions), vec!["c"]);
        assert_eq!(admissions[0].finished_parent, Some(id("p")));
        assert_eq!(admissions[0].orphan_parent, None);
    }

    #[test]
    fn a_finished_parents_frontier_becomes_the_childs_verified_at() {
        let graph = graph(&[("p", None), ("c", Some("p"))]);
        let mut position = position();
        position.admit(&id("p"), None, None);
        position.finish(&id("p"), Some(1234));
        let admissions = admissible(&graph, &position);
        assert_eq!(admissions[0].inherited_verified_at(&position), Some(1234));
        let root = Admission {
            shard: id("r"),
            orphan_parent: None,
            finished_parent: None,
        };
        assert_eq!(root.inherited_verified_at(&position), None);
    }

    #[test]
    fn an_orphan_parent_makes_its_child_a_root() {
        let graph = graph(&[("c", Some("gone"))]);
        let admissions = admissible(&graph, &position());
        assert_eq!(
            admissions,
            vec![Admission {
                shard: id("c"),
                orphan_parent: Some(id("gone")),
                finished_parent: None
            }]
        );
    }

    #[test]
    fn a_parent_known_to_the_position_but_not_described_holds_its_child_back() {
        let graph = graph(&[("c", Some("p"))]);
        let mut position = position();
        position.admit(&id("p"), None, None);
        assert!(admissible(&graph, &position).is_empty());
        position.advance(&id("p"), &SequenceNumber::parse("3").unwrap());
        assert!(admissible(&graph, &position).is_empty());
    }

    #[test]
    fn a_finished_parent_that_is_no_longer_described_still_unblocks_its_child() {
        let graph = graph(&[("c", Some("p"))]);
        let mut position = position();
        position.finish(&id("p"), Some(9));
        let admissions = admissible(&graph, &position);
        assert_eq!(admissions[0].finished_parent, Some(id("p")));
        assert_eq!(admissions[0].orphan_parent, None);
    }

    #[test]
    fn shards_known_to_the_position_are_not_admitted_again() {
        let graph = graph(&[("a", None), ("b", None), ("c", None)]);
        let mut position = position();
        position.admit(&id("a"), None, None);
        position.advance(&id("a"), &SequenceNumber::parse("1").unwrap());
        position.finish(&id("b"), None);
        assert_eq!(ids(&admissible(&graph, &position)), vec!["c"]);
    }

    #[test]
    fn admissions_are_ordered_by_depth_then_id() {
        // r1 → r2 (both finished) → c, at depth 2; y has no parent; x's parent is an orphan.
        let graph = graph(&[
            ("c", Some("r2")),
            ("r2", Some("r1")),
            ("r1", None),
            ("y", None),
            ("x", Some("gone")),
        ]);
        let mut position = position();
        position.finish(&id("r1"), None);
        position.finish(&id("r2"), None);
        assert_eq!(ids(&admissible(&graph, &position)), vec!["x", "y", "c"]);
    }

    #[test]
    fn a_parent_cycle_in_malformed_input_does_not_loop() {
        let graph = graph(&[("a", Some("b")), ("b", Some("a")), ("c", Some("a"))]);
        let mut position = position();
        assert!(admissible(&graph, &position).is_empty());
        position.finish(&id("a"), None);
        position.finish(&id("b"), None);
        assert_eq!(ids(&admissible(&graph, &position)), vec!["c"]);
    }

    #[test]
    fn pruning_drops_finished_ids_that_nothing_described_needs() {
        let graph = graph(&[("kept", None), ("child", Some("parent"))]);
        let mut position = position();
        for shard in ["kept", "parent", "gone"] {
            position.finish(&id(shard), Some(10));
        }
        position.admit(&id("stored"), Some(20), Some(7));
        prune(&graph, &mut position);
        let finished: Vec<&str> = position.finished().map(ShardId::as_str).collect();
        assert_eq!(finished, vec!["kept", "parent"]);
        assert!(!position.knows(&id("gone")), "its frontier goes with it");
        assert_eq!(position.verified_at(&id("parent")), Some(10));
        assert_eq!(
            position.shards[&id("stored")],
            ShardProgress::TrimHorizon {
                verified_at: Some(20),
                floor_ms: Some(7)
            },
            "unfinished shards stay"
        );
    }

    /// SplitMix64: a small deterministic PRNG, so a failing seed can be replayed.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// A random forest: each shard's parent is none, an orphan, or an earlier shard.
    fn random_forest(rng: &mut Rng) -> Vec<ShardDescription> {
        let n = 1 + rng.below(40);
        (0..n)
            .map(|i| {
                let parent = match rng.below(4) {
                    0 => None,
                    1 => Some(id(&format!("orphan{i:02}"))),
                    _ if i > 0 => Some(id(&format!("s{:02}", rng.below(i)))),
                    _ => None,
                };
                ShardDescription {
                    id: id(&format!("s{i:02}")),
                    parent,
                    closed: rng.below(2) == 0,
                }
            })
            .collect()
    }

    #[test]
    fn admitting_and_finishing_in_any_order_admits_every_shard_once_after_its_parent() {
        for seed in 0..500u64 {
            let mut rng = Rng(seed);
            let shards = random_forest(&mut rng);
            let mut graph = ShardGraph::new();
            let mut position = position();
            let mut admitted: BTreeSet<ShardId> = BTreeSet::new();
            let mut active: Vec<ShardId> = Vec::new();
            let mut discovered = 0;
            for round in 0.. {
                assert!(round < 10_000, "seed {seed}: no progress");
                // Discover a prefix: a parent is never described after its child.
                if discovered < shards.len() && rng.below(2) == 0 {
                    let upto = discovered + 1 + rng.below(shards.len() - discovered);
                    graph.merge(shards[discovered..upto].iter().cloned());
                    discovered = upto;
                }
                let admissions = admissible(&graph, &position);
                for admission in &admissions {
                    let shard = &admission.shard;
                    assert!(admitted.insert(shard.clone()), "seed {seed}: {shard} twice");
                    if let Some(parent) = &graph.get(shard).unwrap().parent
                        && graph.contains(parent)
                    {
                        assert!(
                            position.is_finished(parent),
                            "seed {seed}: {shard} admitted before its parent {parent} finished"
                        );
                    }
                    position.admit(shard, admission.inherited_verified_at(&position), None);
                    active.push(shard.clone());
                }
                // Finish a random number of active shards in a random order.
                let finishing = if active.is_empty() {
                    0
                } else {
                    rng.below(active.len() + 1)
                };
                for _ in 0..finishing {
                    let shard = active.swap_remove(rng.below(active.len()));
                    if rng.below(2) == 0 {
                        let seq = SequenceNumber::parse(&rng.next().to_string()).unwrap();
                        position.advance(&shard, &seq);
                    }
                    position.finish(&shard, Some(rng.below(1000) as i64));
                }
                prune(&graph, &mut position);
                let done = discovered == shards.len() && active.is_empty() && admissions.is_empty();
                if done && admissible(&graph, &position).is_empty() {
                    break;
                }
            }
            assert_eq!(admitted.len(), shards.len(), "seed {seed}: not every shard");
        }
    }
}
