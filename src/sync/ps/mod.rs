//! The parameter-server engine and what the parameter-server modes share, apart from any one
//! mode's options (Bosen §3: every process is client and server; the heterogeneity-aware
//! parameter server's apply rules, its §4-5):
//! - the engine's settings ([`settings`]): staleness, apply rule and send policy, built by the
//!   mode declarations (ssp.rs, bosen.rs) from their option groups;
//! - the SSP client ([`client`]): the clock protocol, lazy reads, pushes, checkpoint state and
//!   metrics of `--sync ssp` and `--sync bosen`;
//! - the shard server ([`server`]): the apply rules (plain, ConSGD, DynSGD) with DynSGD's and
//!   AdaRevision's server state; AdaRevision's arithmetic ([`adarevision`]);
//! - the message layout between them ([`protocol`]);
//! - a checkpoint resumed at another rank count: the shards and their per-row state re-partitioned
//!   by row ([`resize`]);
//! - the send policy ([`policy`]) the engine is given: plain SSP, or Bösen's managed
//!   communication ([`managed`]: the budget spent between clocks, the priorities, fp16 pushes);
//! - building the engine for a declaration ([`build`]);
//! - (their row codec, sparse rows in single or half precision, is [`super::codec::rows`]);
//! - the shards ([`shards`]): which rows each rank serves (ssp, bosen, lda);
//! - the serve loop ([`serve`]): a rank that waits keeps serving the others (ssp, bosen,
//!   async, gaia), with one back-off and one timeout.
//! - the clock bookkeeping of a server ([`clocks`]): clocks completed per worker, the slowest,
//!   and the evaluation snapshots it releases (ssp and bosen shards, the async coordinator).

pub mod adarevision;
pub mod build;
pub mod client;
pub mod clocks;
pub mod managed;
pub mod policy;
pub mod protocol;
pub mod resize;
pub mod serve;
pub mod server;
pub mod settings;
pub mod shards;
