//! How the parameter servers' model is split into shards, one per rank.

use std::ops::Range;

use crate::model::RowLayout;

/// Parameter ranges of each rank's shard: contiguous rows, balanced by parameter count.
pub fn shard_ranges(layout: &RowLayout, n: usize) -> Vec<Range<usize>> {
    shard_rows(layout, n).into_iter().map(|r| layout.offsets[r.start]..layout.offsets[r.end]).collect()
}

/// Row ranges of each rank's shard (see [`shard_ranges`]).
pub fn shard_rows(layout: &RowLayout, n: usize) -> Vec<Range<usize>> {
    let total = *layout.offsets.last().unwrap_or(&0);
    let rows = layout.rows();
    // Rank r's first row is the first whose start offset is at or past r/n of the parameters.
    let first_row = |r: usize| -> usize {
        if r >= n {
            return rows;
        }
        layout.offsets[..rows].partition_point(|&o| o * n < r * total)
    };
    (0..n).map(|r| first_row(r)..first_row(r + 1)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_every_row_once_and_balance_parameters() {
        let layout = RowLayout::uniform(10, 785);
        let s = shard_ranges(&layout, 8);
        assert_eq!(s.len(), 8);
        assert_eq!(s[0].start, 0);
        assert_eq!(s[7].end, 7850);
        for w in s.windows(2) {
            assert_eq!(w[0].end, w[1].start);
        }
        assert!(s.iter().all(|r| !r.is_empty() && r.len() % 785 == 0));
        // More ranks than rows: some shards are empty, none is split inside a row.
        let s = shard_ranges(&RowLayout::uniform(3, 4), 5);
        assert_eq!(s.iter().map(|r| r.len()).sum::<usize>(), 12);
        assert!(s.iter().all(|r| r.len() % 4 == 0));
        assert_eq!(s.iter().filter(|r| r.is_empty()).count(), 2);
    }
}
