//! HDF5 checkpoints (the final model file is written by model_file.rs, which uses this module's
//! `write_atomic`, so it is named, not linked).
//!
//! A checkpoint holds every rank's replica (`params`, ranks x P), every rank's shuffle RNG state at
//! the start of the current epoch (`rng`, ranks x 4; a resumed epoch replays the shuffles of the
//! passes over a cycling shard from it, `Run::train`), the position in training as attributes
//! (`epoch`, `step_in_epoch`, `global_step`, `round`, `train_seconds`, `ranks`) and the effective
//! configuration and model spec as JSON string attributes. Rank 0 writes it to a temporary file
//! and renames it, so a crash never leaves a half-written checkpoint under the real name.
//!
//! For resumes at another rank count ([`super::elastic`]) it also holds each rank's file rows
//! (`example_rows`, ranks x 2, `u64::MAX` where the shard is no range of the file), where they
//! are not (a label-skewed `--partition`) every rank's example ids laid end to end
//! (`example_ids`, ascending within each rank's part) with each rank's count
//! (`example_id_counts`; 0 where a rank knew no ids), and, inside an
//! epoch dealt at an earlier resize, the examples dealt (`dealt_ids`) and the steps they take
//! (attribute `dealt_steps`); `step_in_epoch` then counts the steps into them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use hdf5::types::VarLenUnicode;
use mpi::topology::{Communicator, SimpleCommunicator};
use ndarray::{Array1, Array2};

use super::elastic::{self, Dealt, Walk};
use crate::comm::collectives::{self, agree};
use crate::config::{TrainConfig, TRAJECTORY_FREE};
use crate::sync::ModeState;

/// How many checkpoints to keep in the directory (older ones are deleted).
const KEEP: usize = 2;

/// Where training stands, enough to continue exactly.
#[derive(Clone, Debug, PartialEq)]
pub struct Position {
    pub epoch: usize,
    pub step_in_epoch: usize,
    pub global_step: u64,
    pub round: u64,
    pub train_seconds: f64,
}

/// This rank's share of a loaded checkpoint.
pub struct Restored {
    pub position: Position,
    pub params: Vec<f32>,
    pub epoch_rng: [u64; 4],
    pub path: PathBuf,
    /// The current epoch's examples dealt at a resize, all of them: the checkpoint's own (same
    /// rank count), or those left of its epoch to be dealt now (`resized`; their steps are this
    /// run's to count).
    pub dealt: Option<Dealt>,
    /// Written by another rank count: `params` is the replicas' average (or the servers' model,
    /// [`ResizePlan::model`]), `epoch_rng` unset.
    pub resized: Option<Resized>,
}

/// What a resume at another rank count takes from the checkpoint besides the average.
pub struct Resized {
    /// The rank count that wrote it.
    pub from: usize,
    /// Every old rank's mode state (on rank 0; empty elsewhere), for [`super::elastic::carried_state`].
    pub old_states: Vec<ModeState>,
    /// SAGA's per-example history of every old rank by example id (on every rank; empty
    /// without it): [`super::elastic::per_example`].
    pub per_example: (Vec<u64>, Vec<f64>),
}

/// What a resume needs to know of this run to continue a checkpoint of another rank count.
pub struct ResizePlan {
    /// Ok when the run may resume at another rank count, else why not (said in the refusal).
    pub allowed: Result<(), String>,
    /// `--batch-size`.
    pub batch: usize,
    /// The held-out split's fraction and seed, when it applies (`--test-fraction` without
    /// `--test-data`).
    pub holdout: Option<(f64, u64)>,
    /// The mode-state entry whose old ranks' parts, laid end to end, are the model a resize
    /// starts from (`ModeSpec::resize_model`: the parameter servers' shards); None: the
    /// replicas' average.
    pub model: Option<&'static str>,
}

/// Which run a checkpoint belongs to: a hash of the whole resolved configuration
/// (the run plan's `resolved`: [`super::plan::with_mode_defaults`]) less the options that do not change the trajectory
/// ([`crate::config::TRAJECTORY_FREE`]: outputs, `--max-rounds`, `--resume`, evaluation
/// settings), and one of that and the rank count. Checkpoints are named by the run identity, and
/// pruning and `--resume` look only at the run's own, so a directory shared by two runs loses
/// nothing, and a run never continues another's checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunIdentity {
    /// Hash of the trajectory-determining options (16 hex digits).
    pub config_id: String,
    /// Hash of `config_id` and the rank count (16 hex digits).
    pub run_id: String,
    /// The options hashed ([`RunIdentity::hashed_options`]): a `--resume` that finds only other
    /// runs' checkpoints names the options in which they differ.
    options: BTreeMap<String, serde_json::Value>,
    /// Options the run chose itself and why (the run plan's `chosen`), said beside a difference.
    chosen: Vec<(String, String)>,
    ranks: usize,
}

impl RunIdentity {
    /// The identity of a run of the `resolved` options (the run plan's) on `ranks` ranks.
    pub fn new(resolved: &TrainConfig, ranks: usize) -> Self {
        let options = Self::hashed_options(resolved);
        let text = serde_json::to_string(&options).expect("options serialise");
        let config_id = format!("{:016x}", fnv1a(text.as_bytes()));
        let run_id = format!("{:016x}", fnv1a(format!("{config_id}/{ranks}").as_bytes()));
        RunIdentity { config_id, run_id, options, chosen: Vec::new(), ranks }
    }

    /// The identity, knowing which options the run chose itself and why (`chosen`: key, reason).
    pub fn with_chosen(mut self, chosen: &[(String, String)]) -> Self {
        self.chosen = chosen.to_vec();
        self
    }

    /// What the identity hashes: every option of the resolved configuration by its key, sorted
    /// (so moving an option between flattened groups changes nothing), less the trajectory-free
    /// ones. The configuration is finite (its float options' parsers refuse NaN and infinity), so
    /// JSON holds it exactly.
    pub fn hashed_options(resolved: &TrainConfig) -> BTreeMap<String, serde_json::Value> {
        let serde_json::Value::Object(all) = serde_json::to_value(resolved).expect("options serialise") else {
            unreachable!("a struct serialises to an object")
        };
        all.into_iter().filter(|(k, _)| !TRAJECTORY_FREE.iter().any(|(free, _)| free == k)).collect()
    }
}

/// FNV-1a, 64 bits: a stable hash (std's hasher may change between Rust releases).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

fn ckpt_name(id: &RunIdentity, round: u64) -> String {
    format!("ckpt-{}-{round:010}.h5", id.run_id)
}

/// Removes temporary checkpoint files this run left behind (a crash or a signal in the middle of
/// a write). Rank 0 only.
pub fn remove_stale_temporaries(dir: &Path, id: &RunIdentity) {
    let prefix = format!(".ckpt-{}-", id.run_id);
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(&prefix) && name.ends_with(".tmp") {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

fn str_attr(loc: &hdf5::Location, name: &str, value: &str) -> hdf5::Result<()> {
    let v: VarLenUnicode = value.parse().map_err(|e| hdf5::Error::from(format!("{e:?}")))?;
    loc.new_attr::<VarLenUnicode>().create(name)?.write_scalar(&v)
}

/// Writes `file` atomically: `fill` writes into a temporary file in the same directory which is
/// then renamed over `file`.
pub fn write_atomic(file: &Path, fill: impl FnOnce(&hdf5::File) -> hdf5::Result<()>) -> anyhow::Result<()> {
    let dir = file.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    // The directory exists: outputs::check made it (or found it) before training.
    let tmp = dir.join(format!(".{}.{}.tmp", file.file_name().and_then(|s| s.to_str()).unwrap_or("out"), std::process::id()));
    let res = (|| -> hdf5::Result<()> {
        let f = hdf5::File::create(&tmp)?;
        fill(&f)?;
        f.close()
    })();
    if let Err(e) = res {
        let _ = std::fs::remove_file(&tmp);
        bail!("cannot write {}: {e}", file.display());
    }
    std::fs::rename(&tmp, file).with_context(|| format!("cannot rename {} to {}", tmp.display(), file.display()))?;
    Ok(())
}

/// What a checkpoint holds besides the position.
pub struct Contents<'a> {
    pub params: &'a [f32],
    pub epoch_rng: [u64; 4],
    /// This rank's sync-mode state (`sync/rank{r}/{name}` datasets in the file).
    pub mode_state: &'a ModeState,
    pub config_json: &'a str,
    pub spec_json: &'a str,
    /// This rank's file rows (`setup::Shards::rows`).
    pub rows: Option<(u64, u64)>,
    /// This rank's example ids, on every rank where the shards are no ranges of the file
    /// (`--partition` other than iid; empty where unknown), else None on every rank.
    pub ids: Option<&'a [u64]>,
    /// This rank's share of the current epoch's examples dealt at a resize, while it lasts.
    pub dealt: Option<&'a Dealt>,
}

/// Collective: gathers every replica, RNG state and sync-mode state at rank 0, which writes the
/// checkpoint.
pub fn save(comm: &SimpleCommunicator, dir: &str, id: &RunIdentity, pos: &Position, c: &Contents) -> anyhow::Result<()> {
    let (params, epoch_rng, config_json, spec_json) = (c.params, c.epoch_rng, c.config_json, c.spec_json);
    let all = collectives::gather(comm, 0, params);
    let rngs = collectives::gather(comm, 0, &epoch_rng);
    let rows = collectives::gather(comm, 0, &c.rows.map_or([u64::MAX; 2], |(a, b)| [a, b]));
    let ids = c.ids.map(|ids| collectives::gather_varcount(comm, 0, ids));
    // Every rank keeps its share of a dealt epoch; the checkpoint holds them all.
    let dealt = c.dealt.map(|d| {
        let mut ids: Vec<u64> = collectives::gather_varcount(comm, 0, &d.ids).into_iter().flatten().collect();
        ids.sort_unstable();
        (ids, d.steps)
    });
    // Mode state of every rank: names (one per line), lengths, values.
    let names: Vec<u8> = c.mode_state.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>().join("\n").into_bytes();
    let lens: Vec<u64> = c.mode_state.iter().map(|(_, v)| v.len() as u64).collect();
    let values: Vec<f64> = c.mode_state.iter().flat_map(|(_, v)| v.iter().copied()).collect();
    let (all_names, all_lens, all_values) = (
        collectives::gather_varcount(comm, 0, &names),
        collectives::gather_varcount(comm, 0, &lens),
        collectives::gather_varcount(comm, 0, &values),
    );
    let r = if comm.rank() == 0 {
        let n = comm.size() as usize;
        let path = Path::new(dir).join(ckpt_name(id, pos.round));
        let res = write_atomic(&path, |f| {
            f.new_dataset_builder().with_data(&Array2::from_shape_vec((n, params.len()), all).unwrap()).create("params")?;
            f.new_dataset_builder().with_data(&Array2::from_shape_vec((n, 4), rngs).unwrap()).create("rng")?;
            f.new_dataset_builder().with_data(&Array2::from_shape_vec((n, 2), rows).unwrap()).create("example_rows")?;
            if let Some(ids) = &ids {
                let counts: Vec<u64> = ids.iter().map(|v| v.len() as u64).collect();
                f.new_dataset_builder().with_data(&Array1::from_vec(ids.concat())).create("example_ids")?;
                f.new_dataset_builder().with_data(&Array1::from_vec(counts)).create("example_id_counts")?;
            }
            if let Some((ids, steps)) = &dealt {
                f.new_dataset_builder().with_data(&Array1::from_vec(ids.clone())).create("dealt_ids")?;
                f.new_attr::<u64>().create("dealt_steps")?.write_scalar(&(*steps as u64))?;
            }
            for (k, v) in [
                ("epoch", pos.epoch as u64),
                ("step_in_epoch", pos.step_in_epoch as u64),
                ("global_step", pos.global_step),
                ("round", pos.round),
                ("ranks", n as u64),
            ] {
                f.new_attr::<u64>().create(k)?.write_scalar(&v)?;
            }
            f.new_attr::<f64>().create("train_seconds")?.write_scalar(&pos.train_seconds)?;
            str_attr(f, "config", config_json)?;
            str_attr(f, "model_spec", spec_json)?;
            str_attr(f, "run_id", &id.run_id)?;
            str_attr(f, "config_id", &id.config_id)?;
            let group = f.create_group("sync")?;
            for (r, ((names, lens), values)) in all_names.iter().zip(&all_lens).zip(&all_values).enumerate() {
                let g = group.create_group(&format!("rank{r}"))?;
                let names = String::from_utf8_lossy(names);
                let mut rest = &values[..];
                for (name, &len) in names.split('\n').filter(|n| !n.is_empty()).zip(lens) {
                    let (head, tail) = rest.split_at(len as usize);
                    g.new_dataset_builder().with_data(&Array1::from_vec(head.to_vec())).create(name)?;
                    rest = tail;
                }
            }
            Ok(())
        });
        if res.is_ok() {
            prune(Path::new(dir), id);
            log::info!("checkpoint written: {}", path.display());
        }
        res
    } else {
        Ok(())
    };
    agree(comm, r)
}

/// Checkpoints in `dir` as (run id, round, path), sorted by round.
pub(super) fn list_checkpoints(dir: &Path) -> Vec<(String, u64, PathBuf)> {
    let mut v: Vec<(String, u64, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let (id, round) = name.strip_prefix("ckpt-")?.strip_suffix(".h5")?.split_once('-')?;
            Some((id.to_owned(), round.parse().ok()?, e.path()))
        })
        .collect();
    v.sort_by_key(|c| c.1);
    v
}

/// This run's checkpoints in `dir`, oldest first.
fn own_checkpoints(dir: &Path, id: &RunIdentity) -> Vec<(u64, PathBuf)> {
    list_checkpoints(dir).into_iter().filter(|c| c.0 == id.run_id).map(|c| (c.1, c.2)).collect()
}

fn prune(dir: &Path, id: &RunIdentity) {
    let all = own_checkpoints(dir, id);
    for (_, p) in all.iter().take(all.len().saturating_sub(KEEP)) {
        let _ = std::fs::remove_file(p);
    }
}

fn read_u64(f: &hdf5::File, name: &str) -> hdf5::Result<u64> {
    f.attr(name)?.read_scalar::<u64>()
}

/// The checkpoint a resume continues and the rank count that wrote it (rank 0): the newest of
/// this run's or, when `elastic`, the one furthest on of this run's options (its config id) at
/// any rank count, this run's own on a tie.
fn resumable(dir: &Path, id: &RunIdentity, elastic: bool) -> Option<(PathBuf, usize)> {
    let mut best: Option<(u64, bool, PathBuf, usize)> = None;
    for (run, round, path) in list_checkpoints(dir) {
        let own = run == id.run_id;
        let ranks = if own {
            Some(id.ranks)
        } else if elastic {
            (|| {
                let f = hdf5::File::open(&path).ok()?;
                let cid: VarLenUnicode = f.attr("config_id").ok()?.read_scalar().ok()?;
                (cid.as_str() == id.config_id).then_some(())?;
                read_u64(&f, "ranks").ok().map(|r| r as usize)
            })()
        } else {
            None
        };
        if let Some(ranks) = ranks {
            if best.as_ref().is_none_or(|b| (round, own) >= (b.0, b.1)) {
                best = Some((round, own, path, ranks));
            }
        }
    }
    best.map(|b| (b.2, b.3))
}

/// A list of numbers from rank 0 to every rank.
fn broadcast_u64s(comm: &SimpleCommunicator, v: Vec<u64>) -> Vec<u64> {
    let mut len = [v.len() as u64];
    collectives::broadcast(comm, 0, &mut len);
    let mut out = if comm.rank() == 0 { v } else { vec![0; len[0] as usize] };
    // Open MPI refuses the dangling pointer of an empty buffer.
    if !out.is_empty() {
        collectives::broadcast(comm, 0, &mut out[..]);
    }
    out
}

fn read_position(f: &hdf5::File) -> hdf5::Result<[u64; 5]> {
    Ok([
        read_u64(f, "epoch")?,
        read_u64(f, "step_in_epoch")?,
        read_u64(f, "global_step")?,
        read_u64(f, "round")?,
        f.attr("train_seconds").and_then(|a| a.read_scalar::<f64>())?.to_bits(),
    ])
}

fn position_of(pos: &[u64]) -> Position {
    Position {
        epoch: pos[0] as usize,
        step_in_epoch: pos[1] as usize,
        global_step: pos[2],
        round: pos[3],
        train_seconds: f64::from_bits(pos[4]),
    }
}

/// The examples dealt in the checkpoint's epoch, if it is one dealt at a resize.
fn read_dealt(f: &hdf5::File) -> hdf5::Result<Option<Dealt>> {
    if !f.link_exists("dealt_ids") {
        return Ok(None);
    }
    let ids = f.dataset("dealt_ids")?.read_1d::<u64>()?.into_raw_vec_and_offset().0;
    Ok(Some(Dealt { total: ids.len() as u64, ids, steps: read_u64(f, "dealt_steps")? as usize }))
}

/// The replicas (ranks x `n_params`) of checkpoint `f` at `path`, checked.
fn read_params(f: &hdf5::File, path: &Path, ranks: usize, n_params: usize) -> anyhow::Result<Vec<f32>> {
    let params: Array2<f32> = f.dataset("params").and_then(|d| d.read_2d()).with_context(|| damaged(path))?;
    if params.ncols() != n_params {
        bail!(
            "checkpoint {} holds a model of {} parameters, this run builds {n_params}: same model options and data are needed",
            path.display(),
            params.ncols()
        );
    }
    if params.nrows() != ranks {
        bail!("checkpoint {} is damaged: it says {ranks} ranks but holds {} replicas", path.display(), params.nrows());
    }
    Ok(params.into_raw_vec_and_offset().0)
}

/// The RNG states (ranks x 4) of checkpoint `f` at `path`, checked.
fn read_rngs(f: &hdf5::File, path: &Path, ranks: usize) -> anyhow::Result<Vec<u64>> {
    let rng: Array2<u64> = f.dataset("rng").and_then(|d| d.read_2d()).with_context(|| damaged(path))?;
    if rng.dim() != (ranks, 4) {
        bail!("checkpoint {} is damaged: its RNG states have shape {:?}, not ({ranks}, 4)", path.display(), rng.dim());
    }
    Ok(rng.into_raw_vec_and_offset().0)
}

fn damaged(path: &Path) -> String {
    format!("checkpoint {} is damaged or not ours", path.display())
}

/// Collective: rank 0 finds the checkpoint to continue ([`resumable`]) and reads it. At the rank
/// count that wrote it each rank gets its own replica and RNG state; at another, where `plan`
/// allows it, every rank gets the replicas' average and the examples left of the epoch
/// ([`super::elastic`]). Errors (no checkpoint, another model size) reach every rank.
pub fn restore(comm: &SimpleCommunicator, dir: &str, id: &RunIdentity, n_params: usize, plan: &ResizePlan) -> anyhow::Result<Restored> {
    let n = comm.size() as usize;
    let found = if comm.rank() == 0 {
        resumable(Path::new(dir), id, plan.allowed.is_ok()).ok_or_else(|| anyhow::anyhow!("{}", no_own_checkpoint(dir, id, plan)))
    } else {
        Ok((PathBuf::new(), 0))
    };
    let (path, ranks) = agree(comm, found)?;
    let mut from = [ranks as u64];
    collectives::broadcast(comm, 0, &mut from);
    if from[0] as usize == n {
        restore_same(comm, &path, n_params)
    } else {
        restore_resized(comm, &path, n_params, plan, from[0] as usize)
    }
}

/// [`restore`] at the rank count that wrote the checkpoint `path` (known on rank 0).
fn restore_same(comm: &SimpleCommunicator, path: &Path, n_params: usize) -> anyhow::Result<Restored> {
    let n = comm.size() as usize;
    let loaded = if comm.rank() == 0 {
        (|| -> anyhow::Result<_> {
            let f = hdf5::File::open(path).with_context(|| format!("cannot open checkpoint {}", path.display()))?;
            let params = read_params(&f, path, n, n_params)?;
            let rngs = read_rngs(&f, path, n)?;
            let pos = read_position(&f).with_context(|| damaged(path))?;
            let dealt = read_dealt(&f).with_context(|| damaged(path))?;
            Ok((params, rngs, pos, dealt))
        })()
    } else {
        Ok((Vec::new(), Vec::new(), [0; 5], None))
    };
    let (all, rngs, pos0, dealt) = agree(comm, loaded)?;
    let mut params = vec![0f32; n_params];
    collectives::scatter(comm, 0, &all, &mut params);
    let mut rng = [0u64; 4];
    collectives::scatter(comm, 0, &rngs, &mut rng);
    let mut pos = pos0.to_vec();
    collectives::broadcast(comm, 0, &mut pos[..]);
    let path = PathBuf::from(collectives::broadcast_string(comm, 0, &path.to_string_lossy()));
    // The dealt epoch: its steps (u64::MAX: none), then its examples.
    let mut steps = [dealt.as_ref().map_or(u64::MAX, |d| d.steps as u64)];
    collectives::broadcast(comm, 0, &mut steps);
    let ids = broadcast_u64s(comm, dealt.map_or(Vec::new(), |d| d.ids));
    let dealt = (steps[0] != u64::MAX).then(|| Dealt { total: ids.len() as u64, ids, steps: steps[0] as usize });
    Ok(Restored { position: position_of(&pos), params, epoch_rng: rng, path, dealt, resized: None })
}

/// The model a resize starts from (the replicas' average or the servers' shards), the position,
/// the examples left of the epoch and every old rank's mode state ([`read_resized`]).
type ReadResized = (Vec<f32>, [u64; 5], Vec<u64>, Vec<ModeState>, (Vec<u64>, Vec<f64>));

/// What rank 0 reads of a checkpoint written by `from` ranks for a resume at another count: the
/// model a resize starts from ([`ResizePlan::model`]), the position, the examples left of the
/// epoch and every rank's mode state.
fn read_resized(path: &Path, from: usize, n_params: usize, plan: &ResizePlan) -> anyhow::Result<ReadResized> {
    let f = hdf5::File::open(path).with_context(|| format!("cannot open checkpoint {}", path.display()))?;
    let replicas = read_params(&f, path, from, n_params)?;
    let rngs = read_rngs(&f, path, from)?;
    let pos = read_position(&f).with_context(|| damaged(path))?;
    let dealt = read_dealt(&f).with_context(|| damaged(path))?;
    let (ids, shard_steps) = old_examples(&f, path, from, plan)?;
    let walks: Vec<(Vec<u64>, Walk)> = ids
        .iter()
        .cloned()
        .zip(rngs.chunks(4))
        .map(|(ids, r)| {
            let rng = [r[0], r[1], r[2], r[3]];
            let walk = match &dealt {
                Some(d) => Walk::Dealt { rng, dealt: d },
                None => Walk::Shard { rng, batch: plan.batch, steps: shard_steps },
            };
            (ids, walk)
        })
        .collect();
    let left = elastic::left_of_epoch(&walks, pos[1] as usize);
    let states = (0..from).map(|r| read_rank_state(&f, r)).collect::<anyhow::Result<Vec<_>>>()?;
    let per_example = elastic::per_example(&states, &ids, super::optimizer::Optimizer::PER_EXAMPLE);
    let model = match plan.model {
        None => elastic::average_replicas(&replicas, n_params),
        Some(entry) => {
            let laid = elastic::laid_end_to_end(&states, |name| name == entry);
            let model: Vec<f32> = laid.first().map_or(Vec::new(), |(_, v)| v.iter().map(|&x| x as f32).collect());
            anyhow::ensure!(
                model.len() == n_params,
                "checkpoint {}: its ranks' {entry} hold {} values laid end to end, the model {n_params}: resume it with {from} ranks",
                path.display(),
                model.len()
            );
            model
        }
    };
    Ok((model, pos, left, states, per_example))
}

/// Every old rank's training examples (global ids, ascending) in checkpoint `f` at `path`, written
/// by `from` ranks, and the steps of its epochs (`super::plan::steps_per_epoch`: the smallest
/// shard's mini-batches where the shards are ranges of the file, `--partition iid`, else the mean
/// shard's, over which smaller shards cycle).
fn old_examples(f: &hdf5::File, path: &Path, from: usize, plan: &ResizePlan) -> anyhow::Result<(Vec<Vec<u64>>, usize)> {
    let Ok(rows) = f.dataset("example_rows").and_then(|d| d.read_2d::<u64>()) else {
        bail!(
            "checkpoint {} records no example rows (an older asap-train wrote it), so the examples its epoch has left are unknown: \
             resume it with {from} ranks",
            path.display()
        );
    };
    anyhow::ensure!(rows.dim() == (from, 2), "checkpoint {} is damaged: its example rows have shape {:?}", path.display(), rows.dim());
    if rows.iter().all(|&x| x != u64::MAX) {
        let ids: Vec<Vec<u64>> = rows.rows().into_iter().map(|r| elastic::training_ids((r[0], r[1]), plan.holdout)).collect();
        let steps = ids.iter().map(|v| v.len().div_ceil(plan.batch)).min().unwrap_or(0);
        return Ok((ids, steps));
    }
    let read = (|| -> hdf5::Result<(Vec<u64>, Vec<u64>)> {
        Ok((f.dataset("example_ids")?.read_raw::<u64>()?, f.dataset("example_id_counts")?.read_raw::<u64>()?))
    })();
    let no_ids = || {
        format!("checkpoint {}: the shards of the run that wrote it are no ranges of the file and it records no example ids (an older asap-train wrote it): resume it with {from} ranks", path.display())
    };
    let (all, counts) = read.map_err(|_| anyhow::anyhow!(no_ids()))?;
    anyhow::ensure!(counts.len() == from && counts.iter().all(|&c| c > 0), "{}", no_ids());
    anyhow::ensure!(
        counts.iter().sum::<u64>() == all.len() as u64,
        "checkpoint {} is damaged: its example id counts sum to {}, it holds {} ids",
        path.display(),
        counts.iter().sum::<u64>(),
        all.len()
    );
    let mut ids = Vec::with_capacity(from);
    let mut rest = &all[..];
    for &c in &counts {
        let (head, tail) = rest.split_at(c as usize);
        ids.push(head.to_vec());
        rest = tail;
    }
    let steps = (all.len() / from).div_ceil(plan.batch);
    Ok((ids, steps))
}

/// [`restore`] at another rank count than the `from` that wrote checkpoint `path`.
fn restore_resized(comm: &SimpleCommunicator, path: &Path, n_params: usize, plan: &ResizePlan, from: usize) -> anyhow::Result<Restored> {
    let read = if comm.rank() == 0 {
        read_resized(path, from, n_params, plan)
    } else {
        Ok((Vec::new(), [0; 5], Vec::new(), Vec::new(), (Vec::new(), Vec::new())))
    };
    let (mut params, pos0, left, old_states, (example_ids, example_values)) = agree(comm, read)?;
    let example_ids = broadcast_u64s(comm, example_ids);
    let example_values =
        broadcast_u64s(comm, example_values.iter().map(|x| x.to_bits()).collect()).into_iter().map(f64::from_bits).collect();
    params.resize(n_params, 0.0);
    collectives::broadcast_f32(comm, 0, &mut params);
    let mut pos = pos0.to_vec();
    collectives::broadcast(comm, 0, &mut pos[..]);
    let path = PathBuf::from(collectives::broadcast_string(comm, 0, &path.to_string_lossy()));
    let ids = broadcast_u64s(comm, left);
    Ok(Restored {
        position: position_of(&pos),
        params,
        epoch_rng: [0; 4],
        path,
        dealt: Some(Dealt { total: ids.len() as u64, ids, steps: 0 }),
        resized: Some(Resized { from, old_states, per_example: (example_ids, example_values) }),
    })
}

/// Collective: whether `dir` holds a checkpoint this run can continue (rank 0 looks; all learn
/// it): its own, or with `elastic` one of its options at another rank count.
pub fn has_resumable(comm: &SimpleCommunicator, dir: Option<&str>, id: &RunIdentity, elastic: bool) -> bool {
    let mine = comm.rank() == 0 && dir.is_some_and(|d| resumable(Path::new(d), id, elastic).is_some());
    collectives::max_u64(comm, mine as u64) == 1
}

/// Why `--resume` found nothing of this run in `dir`, saying what is there instead.
fn no_own_checkpoint(dir: &str, id: &RunIdentity, plan: &ResizePlan) -> String {
    let others = list_checkpoints(Path::new(dir));
    let same_options = others.iter().rev().find_map(|(_, _, p)| {
        let f = hdf5::File::open(p).ok()?;
        let cid: VarLenUnicode = f.attr("config_id").ok()?.read_scalar().ok()?;
        (cid.as_str() == id.config_id).then(|| (p.clone(), read_u64(&f, "ranks").ok()))
    });
    match (same_options, others.len()) {
        (Some((p, Some(ranks))), _) => {
            let why = plan.allowed.as_ref().err().map_or(String::new(), |why| format!(" ({why})"));
            format!("checkpoint {} was written by {ranks} ranks; resume it with {ranks} ranks{why}", p.display())
        }
        (_, 0) => format!("--resume: no checkpoint (ckpt-*.h5) in {dir}; run without --resume first"),
        (_, k) => format!(
            "--resume: the {k} checkpoint(s) in {dir} belong to other runs{}; resume with the options of the run that \
             wrote them, or use another --checkpoint-dir",
            others.last().map_or(String::new(), |(_, _, p)| how_it_differs(p, id))
        ),
    }
}

/// How the run that wrote checkpoint `path` differs from this one (`id`): its rank count and the
/// options that differ, each with its two values and why this run chose its own, where it did
/// (issue 43: after a step search at another rank count the message read "other options or seed").
fn how_it_differs(path: &Path, id: &RunIdentity) -> String {
    let read = || -> Option<(u64, TrainConfig)> {
        let f = hdf5::File::open(path).ok()?;
        let config: VarLenUnicode = f.attr("config").ok()?.read_scalar().ok()?;
        Some((read_u64(&f, "ranks").ok()?, serde_json::from_str(config.as_str()).ok()?))
    };
    // A checkpoint of another version that this one cannot read as options: say only that.
    let Some((ranks, theirs)) = read() else { return " (other options or seed)".to_owned() };
    let theirs = RunIdentity::hashed_options(&super::plan::with_mode_defaults(&theirs));
    let keys: std::collections::BTreeSet<&String> = theirs.keys().chain(id.options.keys()).collect();
    let show = |v: Option<&serde_json::Value>| v.map_or("unset".to_owned(), |v| v.to_string());
    let mut differences: Vec<String> = keys
        .into_iter()
        .filter(|k| theirs.get(*k) != id.options.get(*k))
        .map(|k| {
            let why = id.chosen.iter().find(|(c, _)| c == k).map_or(String::new(), |(_, why)| format!(" ({why})"));
            format!("{k} {} there, {} here{why}", show(theirs.get(k)), show(id.options.get(k)))
        })
        .collect();
    if differences.len() > 6 {
        let more = differences.len() - 5;
        differences.truncate(5);
        differences.push(format!("and {more} more"));
    }
    let with = if differences.is_empty() { "the same options (another version of asap-train?)".to_owned() } else { differences.join("; ") };
    let here = if ranks as usize == id.ranks { String::new() } else { format!(" (this run has {})", id.ranks) };
    format!(": {}, the one furthest on, was written by {ranks} ranks{here} with {with}", path.display())
}

/// Collective: every rank reads its own sync-mode state from the checkpoint `path` (the one
/// [`restore`] returned), in the order the datasets are stored.
pub fn restore_mode_state(comm: &SimpleCommunicator, path: &Path) -> anyhow::Result<ModeState> {
    let r = comm.rank() as usize;
    let read =
        hdf5::File::open(path).with_context(|| format!("cannot open checkpoint {}", path.display())).and_then(|f| read_rank_state(&f, r));
    agree(comm, read)
}

/// Rank `r`'s sync-mode state in checkpoint `f`, in the order the datasets are stored.
fn read_rank_state(f: &hdf5::File, r: usize) -> anyhow::Result<ModeState> {
    (|| -> hdf5::Result<ModeState> {
        let Ok(g) = f.group(&format!("sync/rank{r}")) else { return Ok(Vec::new()) };
        let mut out = Vec::new();
        for name in g.member_names()? {
            let v: Array1<f64> = g.dataset(&name)?.read_1d()?;
            out.push((name, v.into_raw_vec_and_offset().0));
        }
        Ok(out)
    })()
    .with_context(|| format!("checkpoint {}: cannot read the sync-mode state of rank {r}", f.filename()))
}

/// Collective: the state a resize carries (`carried`, known on rank 0) to every rank.
pub fn broadcast_state(comm: &SimpleCommunicator, carried: ModeState) -> ModeState {
    let names = carried.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>().join("\n");
    let names = broadcast_u64s(comm, names.bytes().map(u64::from).collect());
    let names = String::from_utf8_lossy(&names.into_iter().map(|b| b as u8).collect::<Vec<u8>>()).into_owned();
    let lens = broadcast_u64s(comm, carried.iter().map(|(_, v)| v.len() as u64).collect());
    let bits = broadcast_u64s(comm, carried.iter().flat_map(|(_, v)| v.iter().map(|x| x.to_bits())).collect());
    let mut rest = &bits[..];
    names
        .split('\n')
        .filter(|n| !n.is_empty())
        .zip(lens)
        .map(|(name, len)| {
            let (head, tail) = rest.split_at(len as usize);
            rest = tail;
            (name.to_owned(), head.iter().map(|&b| f64::from_bits(b)).collect())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Args;

    fn parse(args: &[&str]) -> TrainConfig {
        use clap::FromArgMatches;
        let cmd = TrainConfig::augment_args(clap::Command::new("x").no_binary_name(true));
        let m = cmd.try_get_matches_from(args).unwrap();
        let merged = TrainConfig::merge(None, TrainConfig::from_arg_matches(&m).unwrap(), Some(&m)).unwrap();
        crate::train::plan::with_mode_defaults(&merged.options)
    }

    fn id(args: &[&str]) -> String {
        RunIdentity::new(&parse(args), 4).run_id
    }

    /// Every option declared (flag and config key) enters the identity unless it is listed as
    /// trajectory-free, and every listed name is an option: the identity follows the declarations.
    #[test]
    fn the_identity_hashes_every_option_but_the_trajectory_free() {
        let hashed = RunIdentity::hashed_options(&TrainConfig::default());
        let cmd = TrainConfig::augment_args(clap::Command::new("x"));
        for arg in cmd.get_arguments() {
            let key = arg.get_id().as_str();
            let free = TRAJECTORY_FREE.iter().any(|(k, _)| *k == key);
            assert!(free != hashed.contains_key(key), "option {key}: trajectory-free {free}, hashed {}", hashed.contains_key(key));
        }
        let keys: Vec<&str> = cmd.get_arguments().map(|a| a.get_id().as_str()).collect();
        for (k, _) in TRAJECTORY_FREE {
            assert!(keys.contains(k), "{k} is no option");
        }
    }

    /// The options the old hand-kept identity missed now change it; outputs and the other
    /// trajectory-free options do not; a mode's default and the same value given are one run.
    #[test]
    fn trajectory_options_change_the_identity_and_outputs_do_not() {
        let pairs: [(&[&str], &[&str]); 8] = [
            (&["--sync", "gaia"], &["--sync", "gaia", "--significance", "0.02"]),
            (&["--sync", "gaia"], &["--sync", "gaia", "--groups", "2"]),
            (&["--sync", "gaia"], &["--sync", "gaia", "--dc-staleness", "0"]),
            (&["--sync", "async"], &["--sync", "async", "--barrier", "bsp"]),
            (&["--sync", "async", "--model", "lsq"], &["--sync", "async", "--model", "lsq", "--optimizer", "saga"]),
            (&[], &["--consensus-only"]),
            (&[], &["--label-threshold", "5"]),
            (&[], &["--emulate-bandwidth", "100"]),
        ];
        for (a, b) in pairs {
            assert_ne!(id(a), id(b), "{a:?} vs {b:?}");
        }
        let base = id(&["--sync", "ssp"]);
        for same in [
            &["--sync", "ssp", "--staleness", "3", "--apply", "dynsgd"][..],
            &["--sync", "ssp", "--metrics", "/tmp/m.jsonl", "--save-model", "/tmp/m.h5", "--max-rounds", "5"],
            &["--sync", "ssp", "--eval-every", "3", "--wait-timeout", "5", "--stop-check-every", "2", "--own-models", "1"],
            &["--sync", "ssp", "--checkpoint-dir", "/tmp", "--checkpoint-every", "9", "--resume", "--target", "0.5"],
        ] {
            assert_eq!(id(same), base, "{same:?}");
        }
        assert_eq!(id(&["--sync", "asap"]), id(&["--sync", "asap", "--staleness", "0"]));
        assert_ne!(id(&["--sync", "ssp"]), id(&["--sync", "ssp", "--staleness", "0"]));
        assert_ne!(RunIdentity::new(&parse(&[]), 4), RunIdentity::new(&parse(&[]), 8), "the rank count is part of the run");
        assert_eq!(RunIdentity::new(&parse(&[]), 4).config_id, RunIdentity::new(&parse(&[]), 8).config_id);
    }
}
