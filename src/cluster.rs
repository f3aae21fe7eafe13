//! Cluster profiles (`--cluster FILE.toml`): the machines an emulated run stands for. A profile
//! names a cluster and declares, each number with its source in a comment of the file:
//! - `[compute]`: milliseconds of one local step per model and mini-batch size, as keys
//!   `"MODEL:BATCH"` (`"mlp-H:BATCH"` for an MLP with hidden width H), which `asap-train bench
//!   --write-profile` measures on the machine it runs on;
//! - `bandwidth_mbps` and `latency_ms`: every rank's link, either a number or the per-rank form of
//!   `--emulate-bandwidth` (`"1000,0-1:100"`);
//! - optionally `straggler`: a `--straggler` form (per-rank compute heterogeneity);
//! - optionally `fabric`: `"ideal"` (the default) or `"tcp"`, `--emulate-fabric`'s values (what
//!   carries the links: the real transport's costs the model adds);
//! - optionally `[jitter]`: each step time's variance by the same keys as `[compute]`, an
//!   `--emulate-jitter` form (`bench --write-profile` measures it).
//! - optionally `groups`: the ranks in that many data centres (`--emulate-groups`), with
//!   `lan_bandwidth_mbps` and `lan_latency_ms` the LAN within each (the links above are then the
//!   WAN between them, one link per ordered pair of groups shared by the sending group's ranks).
//!
//! The profile fills `--emulate-compute`, `--emulate-jitter`, `--emulate-bandwidth`,
//! `--emulate-latency`, `--emulate-groups` (and its LAN) and `--straggler` where the command line and the config file left them unset; an explicit option
//! wins. The profiles kept in the repository are in `clusters/`.

use std::collections::BTreeMap;

use anyhow::Context;

use crate::comm::pace::LinkSpec;
use crate::model::ModelKind;
use crate::train::jitter::Jitter;

/// A cluster profile as written in its TOML file.
#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Short name (for logs and tables).
    pub name: String,
    /// What the cluster is, in a sentence.
    #[serde(default)]
    pub description: String,
    /// Link rate of every rank in Mbit/s (a number or the per-rank form).
    pub bandwidth_mbps: Option<LinkSpec>,
    /// One-way latency in milliseconds (a number or the per-rank form).
    pub latency_ms: Option<LinkSpec>,
    /// A `--straggler` form.
    pub straggler: Option<String>,
    /// What carries the links (`--emulate-fabric`); unset: ideal.
    pub fabric: Option<crate::comm::pace::Fabric>,
    /// The ranks in this many data centres of contiguous ranks (`--emulate-groups`); unset: one
    /// link per rank for every pair.
    pub groups: Option<usize>,
    /// With `groups`: the LAN within a data centre, Mbit/s of every rank's own link.
    pub lan_bandwidth_mbps: Option<f64>,
    /// With `groups`: the LAN's one-way latency in milliseconds.
    pub lan_latency_ms: Option<f64>,
    /// Time dilation D: the emulated cluster runs D times slower than the one described (step
    /// times and latencies x D, rates / D), so that 8-64 ranks sharing a few cores keep up with
    /// their declared times. Every ratio between runs is unchanged; seconds divide by D.
    #[serde(default = "one")]
    pub dilation: f64,
    /// Milliseconds per local step, by `"MODEL:BATCH"` (`"mlp-H:BATCH"`).
    #[serde(default)]
    pub compute: BTreeMap<String, f64>,
    /// Each step time's variance, by the same keys: an `--emulate-jitter` form (P:FACTOR pairs,
    /// each step against the median), as `asap-train bench --write-profile` measures it.
    #[serde(default)]
    pub jitter: BTreeMap<String, Jitter>,
}

impl Profile {
    /// Reads and checks a profile file; errors name the file.
    pub fn load(path: &str) -> anyhow::Result<Profile> {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read the cluster profile {path} (--cluster)"))?;
        let p: Profile = toml::from_str(&text).map_err(|e| anyhow::anyhow!("{path}: not a cluster profile: {}", e.message().trim_end()))?;
        for (k, &ms) in &p.compute {
            anyhow::ensure!(
                ms.is_finite() && ms > 0.0,
                "{path}: [compute] {k:?} = {ms}: a step time must be a positive number of milliseconds"
            );
        }
        anyhow::ensure!(p.dilation.is_finite() && p.dilation >= 1.0, "{path}: dilation = {}: must be a number >= 1", p.dilation);
        if let Some(b) = &p.bandwidth_mbps {
            let min = b.overrides.iter().map(|o| o.2).fold(b.default, f64::min);
            anyhow::ensure!(min > 0.0, "{path}: bandwidth_mbps {b}: every rate must be positive");
        }
        if let Some(g) = p.groups {
            anyhow::ensure!(g >= 2, "{path}: groups = {g}: give 2 or more data centres (or leave groups out for one link per rank)");
        }
        if let Some(b) = p.lan_bandwidth_mbps {
            anyhow::ensure!(b.is_finite() && b > 0.0, "{path}: lan_bandwidth_mbps = {b}: must be a positive number of Mbit/s");
        }
        if let Some(l) = p.lan_latency_ms {
            anyhow::ensure!(l.is_finite() && l >= 0.0, "{path}: lan_latency_ms = {l}: must be a number of milliseconds >= 0");
        }
        anyhow::ensure!(
            p.groups.is_some() || (p.lan_bandwidth_mbps.is_none() && p.lan_latency_ms.is_none()),
            "{path}: lan_bandwidth_mbps and lan_latency_ms are the LAN within `groups`' data centres: add `groups = G`, or drop them"
        );
        Ok(p)
    }

    /// The key of the step time of a model with `hidden` widths (an MLP's) at mini-batch `batch`.
    pub fn compute_key(model: ModelKind, hidden: &[usize], batch: usize) -> String {
        match model {
            ModelKind::Mlp => format!("mlp-{}:{batch}", hidden.iter().map(|h| h.to_string()).collect::<Vec<_>>().join("-")),
            _ => format!("{}:{batch}", format!("{model:?}").to_lowercase()),
        }
    }
}

/// What a profile fills: the run's emulation options (each left as it is where the command line
/// or the config file set it) and what picks the step time. The configuration hands its own fields
/// in, so a profile is one more source of values under the configuration, which this file does not
/// know.
pub struct Emulation<'a> {
    pub model: ModelKind,
    pub hidden: &'a [usize],
    pub batch_size: usize,
    /// `--dilation`: replaces the profile's.
    pub dilation: Option<f64>,
    /// `--emulate-compute` (ms per step).
    pub compute_ms: &'a mut Option<f64>,
    /// `--emulate-bandwidth`.
    pub bandwidth: &'a mut Option<LinkSpec>,
    /// `--emulate-latency` (unset: 0 for every rank).
    pub latency: &'a mut LinkSpec,
    /// `--straggler`.
    pub straggler: &'a mut Option<String>,
    /// `--emulate-jitter`.
    pub jitter: &'a mut Option<Jitter>,
    /// `--emulate-fabric` (at its default, ideal, a profile's `fabric` fills it).
    pub fabric: &'a mut crate::comm::pace::Fabric,
    /// `--emulate-groups` (Some(0): off, which a profile does not fill).
    pub groups: &'a mut Option<usize>,
    /// `--emulate-lan-bandwidth`.
    pub lan_bandwidth: &'a mut Option<f64>,
    /// `--emulate-lan-latency`.
    pub lan_latency: &'a mut Option<f64>,
}

fn one() -> f64 {
    1.0
}

/// Fills the emulation options `e` leaves unset from the profile at `path`. A profile without a
/// step time for the run's model and batch size is an error listing the ones it has.
pub fn apply(path: &str, e: Emulation) -> anyhow::Result<()> {
    let mut p = Profile::load(path)?;
    if let Some(d) = e.dilation {
        p.dilation = d;
    }
    let key = Profile::compute_key(e.model, e.hidden, e.batch_size);
    if e.jitter.is_none() {
        *e.jitter = p.jitter.get(&key).cloned();
    }
    if e.compute_ms.is_none() {
        let ms = p.compute.get(&key).copied().ok_or_else(|| {
            anyhow::anyhow!(
                "{path}: cluster {:?} declares no step time for {key:?} (--model and --batch-size); it has {:?}. Add the line `\"{key}\" = MS` to its [compute] table (asap-train bench --write-profile measures it), or give --emulate-compute MS",
                p.name,
                p.compute.keys().collect::<Vec<_>>()
            )
        })?;
        *e.compute_ms = Some(ms * p.dilation);
    }
    if e.bandwidth.is_none() {
        *e.bandwidth = p.bandwidth_mbps.as_ref().map(|b| b.scaled(1.0 / p.dilation));
    }
    if e.latency.default == 0.0 && e.latency.overrides.is_empty() {
        if let Some(l) = &p.latency_ms {
            *e.latency = l.scaled(p.dilation);
        }
    }
    if e.straggler.is_none() {
        *e.straggler = p.straggler.clone();
    }
    // Like the latency: the option at its default (ideal) takes the profile's.
    if *e.fabric == crate::comm::pace::Fabric::Ideal {
        *e.fabric = p.fabric.unwrap_or_default();
    }
    if e.groups.is_none() {
        *e.groups = p.groups;
    }
    // The LAN where there are groups (an explicit `--emulate-groups off` leaves none).
    if e.groups.is_some_and(|g| g > 0) {
        if e.lan_bandwidth.is_none() {
            *e.lan_bandwidth = p.lan_bandwidth_mbps.map(|b| b / p.dilation);
        }
        if e.lan_latency.is_none() {
            *e.lan_latency = p.lan_latency_ms.map(|l| l * p.dilation);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TrainConfig;

    /// What the configuration's merge does with a run's `--cluster`.
    fn apply_to(cfg: &mut TrainConfig) -> anyhow::Result<()> {
        let path = cfg.cluster.clone().expect("a profile");
        apply(&path, cfg.emulation())
    }

    #[test]
    fn a_profile_fills_what_is_unset_and_names_what_it_lacks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "name = \"t\"\ndilation = 2\nbandwidth_mbps = \"1000,0-1:100\"\nlatency_ms = 0.1\n[compute]\n\"mlr:256\" = 10\n\"mlp-1024:64\" = 40.25\n").unwrap();
        let mut cfg = TrainConfig { cluster: Some(path.to_string_lossy().into()), batch_size: 256, ..TrainConfig::default() };
        apply_to(&mut cfg).unwrap();
        assert_eq!(cfg.emulate_compute, Some(20.0));
        // Dilated 2x: times doubled, rates halved.
        assert_eq!(cfg.emulate_bandwidth.as_ref().unwrap().resolve(3, "x").unwrap(), vec![50.0, 50.0, 500.0]);
        assert_eq!(cfg.emulate_bandwidth.as_ref().unwrap().to_string(), "500,0-1:50");
        assert_eq!(cfg.emulate_latency.default, 0.2);
        assert_eq!(cfg.emulate_fabric, crate::comm::pace::Fabric::Ideal, "no fabric: ideal");
        let tcp = dir.path().join("tcp.toml");
        std::fs::write(&tcp, "name = \"t\"\nbandwidth_mbps = 100\nfabric = \"tcp\"\n[compute]\n\"mlr:256\" = 10\n").unwrap();
        let mut t = TrainConfig { cluster: Some(tcp.to_string_lossy().into()), batch_size: 256, ..TrainConfig::default() };
        apply_to(&mut t).unwrap();
        assert_eq!(t.emulate_fabric, crate::comm::pace::Fabric::Tcp);
        std::fs::write(&tcp, "name = \"t\"\nfabric = \"rdma\"\n").unwrap();
        assert!(apply_to(&mut t.clone()).unwrap_err().to_string().contains("not a cluster profile"));
        // An explicit option wins.
        let mut cfg2 = TrainConfig { cluster: cfg.cluster.clone(), batch_size: 256, emulate_compute: Some(5.0), ..TrainConfig::default() };
        apply_to(&mut cfg2).unwrap();
        assert_eq!(cfg2.emulate_compute, Some(5.0));
        let mut mlp = TrainConfig {
            cluster: cfg.cluster.clone(),
            model: ModelKind::Mlp,
            hidden: vec![1024],
            batch_size: 64,
            ..TrainConfig::default()
        };
        apply_to(&mut mlp).unwrap();
        assert_eq!(mlp.emulate_compute, Some(80.5));
        let mut missing = TrainConfig { cluster: cfg.cluster.clone(), batch_size: 32, ..TrainConfig::default() };
        let e = apply_to(&mut missing).unwrap_err().to_string();
        assert!(e.contains("\"mlr:32\"") && e.contains("mlr:256"), "{e}");
        std::fs::write(&path, "name = \"t\"\n[compute]\n\"mlr:256\" = -1\n").unwrap();
        assert!(apply_to(&mut cfg.clone()).unwrap_err().to_string().contains("positive"));
        std::fs::write(&path, "name = \"t\"\nbandwith_mbps = 5\n").unwrap();
        assert!(apply_to(&mut cfg.clone()).unwrap_err().to_string().contains("not a cluster profile"));
    }

    /// A profile's [jitter] fills `--emulate-jitter` for the step time of the same key, unless the
    /// command line gave one; a bad form names the file.
    #[test]
    fn a_profile_fills_the_jitter_of_its_step_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "name = \"t\"\n[compute]\n\"mlr:64\" = 1\n\"mlr:256\" = 4\n[jitter]\n\"mlr:64\" = \"0:0.9,0.5:1,1:2\"\n")
            .unwrap();
        let cluster = Some(path.to_string_lossy().into_owned());
        let mut cfg = TrainConfig { cluster: cluster.clone(), batch_size: 64, ..TrainConfig::default() };
        apply_to(&mut cfg).unwrap();
        assert_eq!(cfg.emulate_jitter.as_ref().map(|j| j.to_string()).as_deref(), Some("0:0.9,0.5:1,1:2"));
        let mut other = TrainConfig { cluster: cluster.clone(), batch_size: 256, ..TrainConfig::default() };
        apply_to(&mut other).unwrap();
        assert!(other.emulate_jitter.is_none(), "no [jitter] for mlr:256");
        let given: Jitter = "0:1,1:3".parse().unwrap();
        let mut explicit =
            TrainConfig { cluster: cluster.clone(), batch_size: 64, emulate_jitter: Some(given.clone()), ..TrainConfig::default() };
        apply_to(&mut explicit).unwrap();
        assert_eq!(explicit.emulate_jitter, Some(given));
        std::fs::write(&path, "name = \"t\"\n[jitter]\n\"mlr:64\" = \"0:1,1:0.5\"\n").unwrap();
        let e = apply_to(&mut cfg.clone()).unwrap_err().to_string();
        assert!(e.contains("c.toml") && e.contains("must not fall"), "{e}");
    }

    /// A profile's `groups` fills `--emulate-groups` with its LAN, dilated as the links are;
    /// `--emulate-groups off` keeps the per-rank links; a bad value names the file.
    #[test]
    fn a_profile_fills_its_groups_and_their_lan() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.toml");
        let text = "name = \"g\"\ndilation = 4\nbandwidth_mbps = 100\nlatency_ms = 50\ngroups = 2\nlan_bandwidth_mbps = 10000\nlan_latency_ms = 0.015\n[compute]\n\"mlr:256\" = 1\n";
        std::fs::write(&path, text).unwrap();
        let cluster = Some(path.to_string_lossy().into_owned());
        let mut cfg = TrainConfig { cluster: cluster.clone(), batch_size: 256, ..TrainConfig::default() };
        apply_to(&mut cfg).unwrap();
        assert_eq!((cfg.emulate_groups, cfg.emulate_lan_bandwidth, cfg.emulate_lan_latency), (Some(2), Some(2500.0), Some(0.06)));
        let mut off = TrainConfig { cluster: cluster.clone(), batch_size: 256, emulate_groups: Some(0), ..TrainConfig::default() };
        apply_to(&mut off).unwrap();
        assert_eq!((off.emulate_groups, off.emulate_lan_bandwidth, off.emulate_lan_latency), (Some(0), None, None));
        std::fs::write(&path, text.replace("groups = 2", "groups = 1")).unwrap();
        let e = apply_to(&mut cfg.clone()).unwrap_err().to_string();
        assert!(e.contains("g.toml") && e.contains("groups = 1"), "{e}");
        std::fs::write(&path, text.replace("groups = 2\n", "")).unwrap();
        let e = apply_to(&mut cfg.clone()).unwrap_err().to_string();
        assert!(e.contains("add `groups = G`"), "{e}");
    }

    #[test]
    fn the_profiles_in_the_repository_load() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/clusters");
        let mut n = 0;
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "toml") {
                let prof = Profile::load(p.to_str().unwrap()).unwrap();
                assert!(prof.bandwidth_mbps.is_some() && !prof.compute.is_empty(), "{}", p.display());
                n += 1;
            }
        }
        assert!(n >= 3, "{n} profiles");
    }
}
