//! Sets of scan segments stored as sorted, disjoint, non-adjacent inclusive ranges.
//!
//! A 10⁶-segment scan that is nearly done stores a few ranges, not a million numbers.

use serde::{Deserialize, Serialize};

/// Sorted, disjoint, non-adjacent inclusive ranges of segment numbers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SegmentRanges(Vec<[u32; 2]>);

impl SegmentRanges {
    /// No segment.
    pub fn new() -> Self {
        SegmentRanges(Vec::new())
    }

    /// Builds from stored ranges, checking they are sorted, disjoint and non-adjacent.
    pub fn from_ranges(ranges: Vec<[u32; 2]>) -> Result<Self, String> {
        for (i, [lo, hi]) in ranges.iter().enumerate() {
            if lo > hi {
                return Err(format!("range [{lo},{hi}] is reversed"));
            }
            if let Some([_, prev_hi]) = i.checked_sub(1).map(|j| ranges[j])
                && u64::from(prev_hi) + 1 >= u64::from(*lo)
            {
                return Err(format!(
                    "range [{lo},{hi}] overlaps or touches the one before"
                ));
            }
        }
        Ok(SegmentRanges(ranges))
    }

    /// The stored ranges.
    pub fn ranges(&self) -> &[[u32; 2]] {
        &self.0
    }

    /// Whether `segment` is in the set.
    pub fn contains(&self, segment: u32) -> bool {
        let i = self.0.partition_point(|[_, hi]| *hi < segment);
        self.0.get(i).is_some_and(|[lo, _]| *lo <= segment)
    }

    /// Number of segments in the set.
    pub fn count(&self) -> u64 {
        self.0.iter().map(|[lo, hi]| u64::from(hi - lo) + 1).sum()
    }

    /// Adds `segment`, merging ranges that become adjacent.
    pub fn insert(&mut self, segment: u32) {
        if self.contains(segment) {
            return;
        }
        let i = self.0.partition_point(|[_, hi]| *hi < segment);
        let joins_prev = i > 0 && self.0[i - 1][1].checked_add(1) == Some(segment);
        let joins_next = self
            .0
            .get(i)
            .is_some_and(|[lo, _]| segment.checked_add(1) == Some(*lo));
        match (joins_prev, joins_next) {
            (true, true) => {
                self.0[i - 1][1] = self.0[i][1];
                self.0.remove(i);
            }
            (true, false) => self.0[i - 1][1] = segment,
            (false, true) => self.0[i][0] = segment,
            (false, false) => self.0.insert(i, [segment, segment]),
        }
    }

    /// The segments of `0..total` not in the set, ascending, without listing them up front.
    pub fn missing(&self, total: u32) -> impl Iterator<Item = u32> + '_ {
        let mut next = 0u32;
        let mut range = 0usize;
        std::iter::from_fn(move || {
            loop {
                if next >= total {
                    return None;
                }
                match self.0.get(range) {
                    Some([lo, hi]) if next >= *lo => {
                        next = hi.checked_add(1)?;
                        range += 1;
                    }
                    _ => {
                        let segment = next;
                        next += 1;
                        return Some(segment);
                    }
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inserting_merges_adjacent_ranges() {
        let mut set = SegmentRanges::new();
        for s in [5, 0, 2, 1, 7, 6] {
            set.insert(s);
        }
        assert_eq!(set.ranges(), &[[0, 2], [5, 7]]);
        set.insert(3);
        set.insert(4);
        assert_eq!(set.ranges(), &[[0, 7]]);
        assert_eq!(set.count(), 8);
        assert!(set.contains(4) && !set.contains(8));
    }

    #[test]
    fn missing_segments_skip_done_ranges_lazily() {
        let set = SegmentRanges::from_ranges(vec![[0, 2], [5, 5]]).unwrap();
        assert_eq!(set.missing(8).collect::<Vec<_>>(), vec![3, 4, 6, 7]);
        let big = SegmentRanges::from_ranges(vec![[0, 999_998]]).unwrap();
        assert_eq!(big.missing(1_000_000).collect::<Vec<_>>(), vec![999_999]);
        let all = SegmentRanges::from_ranges(vec![[0, u32::MAX]]).unwrap();
        assert_eq!(all.missing(u32::MAX).next(), None);
    }

    #[test]
    fn stored_ranges_must_be_sorted_and_apart() {
        assert!(SegmentRanges::from_ranges(vec![[0, 2], [3, 4]]).is_err());
        assert!(SegmentRanges::from_ranges(vec![[4, 2]]).is_err());
        assert!(SegmentRanges::from_ranges(vec![[0, 2], [1, 4]]).is_err());
        assert!(SegmentRanges::from_ranges(vec![[0, 2], [4, 4]]).is_ok());
    }
}
