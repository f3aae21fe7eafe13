//! The server half of a rank in the parameter-server engine: one shard of the model (Bosen
//! §3.1-3.2: every process is client and server), with the server-side rules of the
//! heterogeneity-aware parameter server (ConSGD, DynSGD: its §4-5) and AdaRevision's server
//! state (Bosen §3.4).
//!
//! - **Shards**: the model's rows are split into contiguous blocks, one per rank, balanced by
//!   parameter count ([`super::shards`]); rank s serves the rows of block s. Ranks whose block is
//!   empty (fewer rows than ranks) serve nothing.
//! - **Reads**: a read request for clock k+1 is answered once every worker's updates of clocks
//!   <= k-S are applied (`cmin`, the smallest number of clocks any worker has pushed, is
//!   >= k+1-S), with the rows changed since the worker last got them and `cmin`.
//! - **Apply rules**: plain (w += u), ConSGD (w += u/M) and DynSGD (per-version staleness
//!   scaling with V(m), S(v), u(PS,v), Algorithm 2 of the paper; versions every worker has passed
//!   are freed).
//! - **Order**: with S = 0 a shard applies the pushes of a clock in worker order once all have
//!   arrived (nobody may read before then anyway), so runs and resumed runs are bit-identical;
//!   with S > 0 pushes are applied as they arrive, which is the point of SSP (fresher reads).
//! - **AdaRevision**: rows carry versions, and a snapshot of the accumulated gradient is kept per
//!   (row, version) while some client may still compute with that version.

use std::collections::BTreeMap;
use std::ops::Range;

use anyhow::bail;

use super::adarevision::AdaRevision;
use super::clocks::{EvalSnapshots, WorkerClocks};
use super::protocol::{UNSOLICITED, VERSIONS};
use crate::sync::codec::rows::{encode_rows, RowBlock};

/// How a shard server applies a worker's update (`--apply`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ApplyRule {
    /// w += u (SSPSGD): with M workers the steps add up, so use about 1/M of the allreduce --lr.
    Plain,
    /// w += u / M (ConSGD): at S = 0 exactly model averaging.
    Consgd,
    /// DynSGD: u scaled by 1/staleness, earlier updates of the same version revised.
    Dynsgd,
}

/// DynSGD bookkeeping of one shard (the paper's Table 1).
#[derive(Default)]
pub(crate) struct DynState {
    /// V(m): the version each worker's next update is stamped with.
    pub(crate) version: Vec<u64>,
    /// Number of global-update versions so far (the fastest worker's clock).
    pub(crate) cmax: u64,
    /// Per live version v: (S(v), u(PS, v)).
    pub(crate) updates: BTreeMap<u64, (u64, Vec<f32>)>,
}

/// Snapshots kept per row at most (the oldest go first): a client that never updates a row never
/// says it moved past a version, so without a cap a popular row of a sparse model would keep one
/// snapshot per update.
const SNAPSHOTS_PER_ROW: usize = 16;

/// AdaRevision on a shard (Bosen §3.4): rows carry versions; a snapshot of the accumulated
/// gradient is kept per (row, version) while some client may still compute with that version.
pub(crate) struct AdaShard {
    pub(crate) rev: AdaRevision,
    /// The client steps' size: a pushed update u is the gradient sum -u / lr.
    pub(crate) lr: f32,
    /// Per local row: its version, bumped by every update.
    pub(crate) version: Vec<u64>,
    /// (row, version) -> accumulated gradient of the row at that version. Version 0 is the zero
    /// vector for every row and never stored.
    pub(crate) snapshots: BTreeMap<(u32, u64), Vec<f32>>,
    /// Per worker, per local row: the oldest version it may still push updates for (its pushes
    /// arrive in order and carry the version they were computed from, so a push of version v
    /// means it holds nothing older).
    pub(crate) held_lo: Vec<Vec<u64>>,
    pub(crate) snapshots_peak: usize,
    /// Updates whose snapshot was evicted: the oldest one kept stood in (a smaller backlog, so a
    /// step between the exact one and no revision).
    pub(crate) snapshot_misses: u64,
}

impl AdaShard {
    /// The current version of `row` is being sent to a client: keep its snapshot.
    pub(crate) fn snapshot_current(&mut self, row: u32, offsets: &[usize]) {
        let (r, v) = (row as usize, self.version[row as usize]);
        if v == 0 || self.snapshots.contains_key(&(row, v)) {
            return;
        }
        self.snapshots.insert((row, v), self.rev.g_sum[offsets[r]..offsets[r + 1]].to_vec());
        let kept: Vec<u64> = self.snapshots.range((row, 0)..=(row, u64::MAX)).map(|(k, _)| k.1).collect();
        for &old in kept.iter().take(kept.len().saturating_sub(SNAPSHOTS_PER_ROW)) {
            self.snapshots.remove(&(row, old));
        }
        self.snapshots_peak = self.snapshots_peak.max(self.snapshots.len());
    }

    /// The accumulated gradient a client saw at version `v` of `row`.
    pub(crate) fn g_old(&mut self, row: u32, v: u64, n: usize) -> Vec<f32> {
        if v == 0 {
            return vec![0.0; n];
        }
        if let Some(g) = self.snapshots.get(&(row, v)) {
            return g.clone();
        }
        self.snapshot_misses += 1;
        match self.snapshots.range((row, 0)..=(row, u64::MAX)).next() {
            Some((_, g)) => g.clone(),
            None => vec![0.0; n],
        }
    }

    /// Worker `m` pushed `row` computed from version `v`: it holds nothing older; snapshots no
    /// worker can use any more are freed.
    pub(crate) fn release(&mut self, m: usize, row: u32, v: u64) {
        let r = row as usize;
        self.held_lo[m][r] = self.held_lo[m][r].max(v);
        let oldest = self.held_lo.iter().map(|h| h[r]).min().unwrap_or(0);
        let gone: Vec<u64> = self.snapshots.range((row, 0)..(row, oldest)).map(|(k, _)| k.1).collect();
        gone.into_iter().for_each(|u| {
            self.snapshots.remove(&(row, u));
        });
    }
}

/// The server half of a rank: one shard of the model.
pub(crate) struct ShardServer {
    pub(crate) range: Range<usize>,
    pub(crate) rows: Vec<f32>,
    /// Local row r is `rows[offsets[r]..offsets[r+1]]`.
    pub(crate) offsets: Vec<usize>,
    /// Per row: the apply count (`seq`) when it last changed.
    pub(crate) stamp: Vec<u64>,
    /// Pushes applied so far.
    pub(crate) seq: u64,
    /// Per worker, per row: the row's stamp when it was last sent to that worker (rows stamped
    /// later are news to it).
    pub(crate) sent: Vec<Vec<u64>>,
    /// Bosen: per worker, per row, the L1 change since the row was last sent to it (priority).
    pub(crate) change: Vec<Vec<f32>>,
    /// Clocks each worker has pushed and had applied, and the slowest (`cmin`).
    pub(crate) clocks: WorkerClocks,
    pub(crate) rule: ApplyRule,
    pub(crate) staleness: u64,
    pub(crate) dyn_state: DynState,
    pub(crate) ada: Option<AdaShard>,
    /// Pushes received but not applied yet: (clock, worker) -> rows.
    pub(crate) queued: BTreeMap<(u64, usize), RowBlock>,
    /// DynSGD: the version a queued push was computed from, as its worker stamped it (a worker
    /// that read lazily may still compute from an answer older than the newest one sent to it).
    pub(crate) stamps: BTreeMap<(u64, usize), u64>,
    /// Reads waiting for `cmin >= want`: (worker, want).
    pub(crate) reads: Vec<(usize, u64)>,
    /// Evaluation snapshots: round -> rows once `cmin >= round`.
    pub(crate) snapshots: EvalSnapshots,
    pub(crate) max_live_versions: usize,
}

impl ShardServer {
    pub(crate) fn new(range: Range<usize>, init: &[f32], offsets: Vec<usize>, n: usize, rule: ApplyRule, staleness: u64) -> Self {
        let rows = offsets.len() - 1;
        ShardServer {
            rows: init.to_vec(),
            stamp: vec![0; rows],
            seq: 0,
            sent: vec![vec![0; rows]; n],
            change: Vec::new(),
            range,
            offsets,
            clocks: WorkerClocks::new(n),
            rule,
            staleness,
            dyn_state: DynState { version: vec![0; n], ..Default::default() },
            ada: None,
            queued: BTreeMap::new(),
            stamps: BTreeMap::new(),
            reads: Vec::new(),
            snapshots: EvalSnapshots::default(),
            max_live_versions: 0,
        }
    }

    pub(crate) fn workers(&self) -> usize {
        self.clocks.len()
    }

    /// Bosen's managed communication on this shard: the per-client change of every row (the
    /// priorities of early server pushes), and with `adarevision` (alpha = the client steps'
    /// size) AdaRevision's steps instead of the apply rule.
    pub(crate) fn manage(&mut self, adarevision: Option<f32>) {
        let (rows, n) = (self.stamp.len(), self.workers());
        self.change = vec![vec![0.0; rows]; n];
        if let Some(lr) = adarevision {
            self.ada = Some(AdaShard {
                rev: AdaRevision::new(lr, self.rows.len()),
                lr,
                version: vec![0; rows],
                snapshots: BTreeMap::new(),
                held_lo: vec![vec![0; rows]; n],
                snapshots_peak: 0,
                snapshot_misses: 0,
            });
        }
    }

    /// Applies every queued push that may be applied now; returns whether anything changed.
    pub(crate) fn apply_queued(&mut self) -> anyhow::Result<bool> {
        let mut changed = false;
        loop {
            let next = if self.staleness == 0 {
                // BSP: the whole clock, in worker order, once every worker's push is here.
                let c = self.clocks.min();
                let all_here = (0..self.workers()).all(|m| self.queued.contains_key(&(c, m)));
                if !all_here {
                    break;
                }
                (0..self.workers()).map(|m| (c, m)).collect::<Vec<_>>()
            } else {
                self.queued.keys().copied().collect()
            };
            if next.is_empty() {
                break;
            }
            for key in next {
                let block = self.queued.remove(&key).expect("queued");
                self.apply(key.1, key.0, &block)?;
                changed = true;
            }
            if self.staleness != 0 {
                break;
            }
        }
        Ok(changed)
    }

    /// Applies worker `m`'s update of `clock` and completes that clock.
    pub(crate) fn apply(&mut self, m: usize, clock: u64, block: &RowBlock) -> anyhow::Result<()> {
        if clock != self.clocks.of(m) {
            bail!("ssp protocol error: rank {m} pushed clock {clock} but {} was expected", self.clocks.of(m));
        }
        let stamp = self.stamps.remove(&(clock, m));
        self.apply_rows(m, clock, block, stamp);
        if self.clocks.complete(m) {
            self.snapshots.release(self.clocks.min(), &self.rows);
        }
        Ok(())
    }

    /// Applies worker `m`'s rows (part of its update of `clock`) under the apply rule.
    pub(crate) fn apply_rows(&mut self, m: usize, clock: u64, block: &RowBlock, stamp: Option<u64>) {
        self.seq += 1;
        let seq = self.seq;
        let rows = &block.rows;
        let values = &block.values;
        if self.ada.is_some() {
            let mut at = 0;
            for (k, &r) in rows.iter().enumerate() {
                let range = self.offsets[r as usize]..self.offsets[r as usize + 1];
                let n = range.len();
                let ada = self.ada.as_mut().expect("checked");
                let g: Vec<f32> = values[at..at + n].iter().map(|u| -u / ada.lr).collect();
                let v = block.versions.get(k).copied().unwrap_or(0);
                let g_old = ada.g_old(r, v, n);
                ada.release(m, r, v);
                let before = self.rows[range.clone()].to_vec();
                ada.rev.apply(&mut self.rows[range.clone()], range.start, &g, &g_old);
                ada.version[r as usize] += 1;
                let moved: f32 = self.rows[range.clone()].iter().zip(&before).map(|(a, b)| (a - b).abs()).sum();
                self.note_change(r as usize, moved);
                self.stamp[r as usize] = seq;
                at += n;
            }
            return;
        }
        let scale = match self.rule {
            ApplyRule::Plain => 1.0,
            _ => 1.0 / self.workers() as f32,
        };
        let mut at = 0;
        if self.rule != ApplyRule::Dynsgd {
            for &r in rows {
                let range = self.offsets[r as usize]..self.offsets[r as usize + 1];
                let n = range.len();
                let mut moved = 0.0;
                self.rows[range].iter_mut().zip(&values[at..at + n]).for_each(|(w, x)| {
                    *w += x * scale;
                    moved += (x * scale).abs();
                });
                self.note_change(r as usize, moved);
                self.stamp[r as usize] = seq;
                at += n;
            }
        } else {
            // DynSGD revises the rows earlier updates of the version touched, too: work on the
            // dense update.
            let mut u = vec![0f32; self.rows.len()];
            for &r in rows {
                let range = self.offsets[r as usize]..self.offsets[r as usize + 1];
                let n = range.len();
                u[range].copy_from_slice(&values[at..at + n]);
                self.stamp[r as usize] = seq;
                at += n;
            }
            let st = &mut self.dyn_state;
            // A worker's stamp can fall below V(m): it restarts from the newest answer's cmax,
            // and an answer composed before this worker's last pushes were applied carries a
            // cmax that does not count them. Taken as sent, such a stamp put a second update of
            // the worker into a version it had already stamped, or, where every V had passed
            // that version, into a freed one restarting at S = 1: weight 1, eight times the
            // averaged step at 8 ranks (MovieLens MF, ssp S = 3, 8 ranks: 168-177 such pushes
            // per run, and held-out RMSE spikes to 1.86 that ended 3 of 3 runs beside two
            // CPU burners above the quick report's floor). V(m) only grows, as in the paper's
            // Algorithm 2 (line 9, and line 18 reads cmax >= V(m)).
            let v = stamp.unwrap_or(0).max(st.version[m]);
            let len = self.rows.len();
            let (s_v, u_v) = st.updates.entry(v).or_insert_with(|| (1, vec![0.0; len]));
            // Delta u = (u - u(PS, v)) / S(v): this update weighted 1/d, and the d-1 earlier
            // updates of version v revised from 1/(d-1) to 1/d.
            let inv = 1.0 / *s_v as f32;
            for r in 0..self.offsets.len() - 1 {
                let mut moved = false;
                for j in self.offsets[r]..self.offsets[r + 1] {
                    let du = (u[j] - u_v[j]) * inv;
                    self.rows[j] += du;
                    u_v[j] += du;
                    moved |= du != 0.0;
                }
                if moved {
                    self.stamp[r] = seq;
                }
            }
            *s_v += 1;
            // V(m) + 1: the least version worker m's next update goes into.
            st.version[m] = v + 1;
            st.cmax = st.cmax.max(clock + 1);
            let oldest = *st.version.iter().min().expect("workers");
            st.updates.retain(|&ver, _| ver >= oldest);
            self.max_live_versions = self.max_live_versions.max(st.updates.len());
        }
    }

    /// Bosen priority bookkeeping: row `r` moved by `moved` (L1) for every client.
    pub(crate) fn note_change(&mut self, r: usize, moved: f32) {
        for c in self.change.iter_mut() {
            c[r] += moved;
        }
    }

    /// A rows message to worker `m` with the listed local rows (marked as sent to it).
    /// `header`: [cmin, clocks of worker `m` applied here, DynSGD's newest version (cmax)].
    pub(crate) fn rows_message(&mut self, m: usize, header: [u64; 3], flags: u64, rows: &[u32]) -> Vec<u8> {
        for &r in rows {
            self.sent[m][r as usize] = self.stamp[r as usize];
            if let Some(c) = self.change.get_mut(m) {
                c[r as usize] = 0.0;
            }
        }
        let versions: Option<Vec<u64>> = self.ada.as_mut().map(|ada| {
            rows.iter()
                .map(|&r| {
                    ada.snapshot_current(r, &self.offsets);
                    ada.version[r as usize]
                })
                .collect()
        });
        let flags = flags | if versions.is_some() { VERSIONS } else { 0 };
        let mut msg = Vec::new();
        msg.extend_from_slice(&header[0].to_le_bytes());
        msg.extend_from_slice(&flags.to_le_bytes());
        msg.extend_from_slice(&header[1].to_le_bytes());
        msg.extend_from_slice(&header[2].to_le_bytes());
        encode_rows(&mut msg, &self.offsets, rows, versions.as_deref(), &self.rows, false);
        msg
    }

    /// Local `rows` sent to worker `m` in a message that was taken back before it left: they
    /// count as not sent, so the next answer to its read carries them (sent at 0 is before any
    /// change).
    pub(crate) fn unsend(&mut self, m: usize, rows: &[u32]) {
        rows.iter().for_each(|&r| self.sent[m][r as usize] = 0);
    }

    /// Rows worker `m` has not seen in their current state.
    pub(crate) fn news(&self, m: usize) -> Vec<u32> {
        (0..self.stamp.len()).filter(|&r| self.stamp[r] > self.sent[m][r]).map(|r| r as u32).collect()
    }

    /// Reads that may be answered now: (worker, messages). With `chunk`, the answer is split
    /// into messages of at most that many rows; all but the last go as unsolicited rows.
    pub(crate) fn answerable(&mut self, chunk: Option<usize>) -> Vec<(usize, Vec<u8>)> {
        let cmin = self.clocks.min();
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.reads.len() {
            let (m, want) = self.reads[i];
            if want <= cmin {
                // In order: a worker that reads lazily has several reads out, and takes their
                // answers in turn.
                self.reads.remove(i);
                let version = self.dyn_state.cmax;
                // Only the rows that changed since this worker last got them: the others still
                // hold what it has (its own changes were pushed, and so changed them here).
                let news = self.news(m);
                let size = chunk.unwrap_or(usize::MAX).max(1);
                let mut parts: Vec<&[u32]> = news.chunks(size).collect();
                let last = parts.pop().unwrap_or(&[]);
                let applied = self.clocks.of(m);
                for part in parts {
                    let msg = self.rows_message(m, [cmin, applied, version], UNSOLICITED, part);
                    out.push((m, msg));
                }
                let msg = self.rows_message(m, [cmin, applied, version], 0, last);
                out.push((m, msg));
            } else {
                i += 1;
            }
        }
        out
    }

    /// Ranks whose clock is the slowest this shard has seen.
    pub(crate) fn laggards(&self) -> Vec<usize> {
        self.clocks.slowest()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::codec::rows::{decode_rows, word_at};

    fn server(rule: ApplyRule, n: usize, staleness: u64) -> ShardServer {
        ShardServer::new(0..1, &[0.0], vec![0, 1], n, rule, staleness)
    }

    fn block(rows: Vec<u32>, values: Vec<f32>) -> RowBlock {
        RowBlock { rows, versions: Vec::new(), values }
    }

    #[test]
    fn consgd_and_dynsgd_average_a_bsp_clock_and_plain_adds() {
        for (rule, want) in [(ApplyRule::Plain, 6.0), (ApplyRule::Consgd, 2.0), (ApplyRule::Dynsgd, 2.0)] {
            let mut s = server(rule, 3, 0);
            for (m, u) in [(2, 3.0), (0, 1.0), (1, 2.0)] {
                s.queued.insert((0, m), block(vec![0], vec![u]));
                s.apply_queued().unwrap();
            }
            assert_eq!(s.rows, vec![want], "{rule:?}");
            assert_eq!(s.clocks.min(), 1);
        }
    }

    /// The paper's Appendix C example, first steps: W1 pushes a (version 0), W2 pushes b, then W3
    /// c, W4 d: u(PS,0) is the running mean; W1 pulls (V(1) = cmax = 1) and pushes e (version 1,
    /// staleness 1); W4 ... here with scalars.
    #[test]
    fn dynsgd_scales_by_staleness_per_version() {
        let mut s = server(ApplyRule::Dynsgd, 4, 3);
        let push = |s: &mut ShardServer, m: usize, c: u64, u: f32| {
            s.queued.insert((c, m), block(vec![0], vec![u]));
            s.apply_queued().unwrap();
        };
        push(&mut s, 0, 0, 4.0); // d = 1: w = 4
        assert_eq!(s.rows[0], 4.0);
        push(&mut s, 1, 0, 8.0); // d = 2: w = (4 + 8) / 2
        assert_eq!(s.rows[0], 6.0);
        // Worker 0 reads: the answer carries cmax = 1, the version its next update is stamped with.
        s.reads.push((0, 0));
        let answers = s.answerable(None);
        assert_eq!(answers.len(), 1);
        assert_eq!(word_at(&answers[0].1, 24).unwrap(), 1);
        s.stamps.insert((1, 0), 1);
        push(&mut s, 0, 1, 2.0); // version 1, d = 1: w = 6 + 2
        assert_eq!(s.rows[0], 8.0);
        push(&mut s, 2, 0, 12.0); // version 0, d = 3: u(PS,0) = (4 + 8 + 12) / 3 = 8, w = 8 + 2
        assert_eq!(s.rows[0], 10.0);
        push(&mut s, 3, 0, 0.0); // version 0, d = 4: u(PS,0) = 6, w = 6 + 2
        assert_eq!(s.rows[0], 8.0);
        // Workers 1..3 are at version 1 now, worker 0 at 2: version 0 is freed.
        assert!(!s.dyn_state.updates.contains_key(&0));
        assert_eq!(s.clocks.min(), 1);
    }

    /// A stamp below V(m) (the worker's newest answer predates its last pushes) goes into
    /// version V(m): a worker adds at most one update to a version, and a freed version never
    /// comes back at S = 1. Checked against the sum every version contributes, its mean.
    #[test]
    fn dynsgd_never_stamps_a_worker_back_into_a_version_it_passed() {
        let mut s = server(ApplyRule::Dynsgd, 2, 3);
        let push = |s: &mut ShardServer, m: usize, c: u64, stamp: u64, u: f32| {
            s.stamps.insert((c, m), stamp);
            s.queued.insert((c, m), block(vec![0], vec![u]));
            s.apply_queued().unwrap();
        };
        push(&mut s, 0, 0, 0, 4.0);
        push(&mut s, 1, 0, 0, 8.0); // version 0: (4 + 8) / 2; both V = 1, version 0 freed
        assert!(!s.dyn_state.updates.contains_key(&0));
        push(&mut s, 0, 1, 1, 2.0); // version 1
        push(&mut s, 0, 2, 0, 10.0); // stale stamp 0: version 2, not a fresh version 0
        assert!(!s.dyn_state.updates.contains_key(&0));
        push(&mut s, 1, 1, 1, 6.0); // version 1: (2 + 6) / 2
        push(&mut s, 1, 2, 2, 30.0); // version 2: (10 + 30) / 2
        assert_eq!(s.rows[0], 6.0 + 4.0 + 20.0);
        assert_eq!(s.dyn_state.version, vec![3, 3]);
    }

    /// An answer carries only the rows that changed since the worker's previous answer.
    #[test]
    fn answers_carry_only_rows_changed_since_the_last_read() {
        let mut s = ShardServer::new(0..3, &[0.0; 3], vec![0, 1, 2, 3], 2, ApplyRule::Plain, 1);
        s.queued.insert((0, 0), block(vec![1], vec![5.0]));
        s.apply_queued().unwrap();
        s.reads.push((1, 0));
        let a = s.answerable(None);
        let b = decode_rows(&a[0].1, 32, &s.offsets, false, false).unwrap();
        assert_eq!((b.rows, b.values), (vec![1], vec![5.0]));
        s.reads.push((1, 0));
        let b = decode_rows(&s.answerable(None)[0].1, 32, &s.offsets, false, false).unwrap();
        assert!(b.rows.is_empty(), "nothing new since the last answer");
    }

    #[test]
    fn reads_wait_for_the_staleness_bound() {
        let mut s = server(ApplyRule::Plain, 2, 1);
        s.reads.push((0, 1));
        assert!(s.answerable(None).is_empty(), "cmin 0 < want 1");
        s.queued.insert((0, 0), block(vec![0], vec![1.0]));
        s.apply_queued().unwrap();
        assert!(s.answerable(None).is_empty(), "rank 1 has not pushed clock 0");
        s.queued.insert((0, 1), block(vec![0], vec![1.0]));
        s.apply_queued().unwrap();
        let a = s.answerable(None);
        assert_eq!(a.len(), 1);
        assert_eq!(u64::from_le_bytes(a[0].1[0..8].try_into().unwrap()), 1);
    }
}
