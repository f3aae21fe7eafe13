//! `--sync gaia` across real hosts: 2 groups x 1 host (network namespaces), 2 ranks per host,
//! the groups joined by netlab/wan.sh's link (100 Mbit/s, 20 ms one way through its user-space
//! relay). Skipped, with the reason, where namespaces or tap devices cannot be made (not root,
//! no CAP_NET_ADMIN, no /dev/net/tun).
//!
//! The oracles are the kernel and the delay itself:
//! - the bytes the kernel's tap device of each group carried out of it must hold at least the
//!   WAN payload the program says that host's ranks sent (nothing else crosses: the hosts of a
//!   group share a bridge);
//! - every ICMP round trip between the groups takes at least twice the one-way delay;
//! - at `--dc-staleness 0` a group ends clock t only after the other group's clock-t updates
//!   arrived, which it sent after ending clock t - 1, which needed this group's clock t - 1: so
//!   T clocks take at least (T - 1) one-way delays, however fast the machine. Without the delay
//!   these clocks take ~1 ms each here, so the bound fails if the delay is not in effect. Only
//!   lower bounds are asserted (load makes runs slower, never faster).

mod common;
use common::*;
use std::process::Command;

const DELAY_MS: f64 = 20.0;

const WAN_SH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/netlab/wan.sh");

/// netlab/wan.sh for the set-up `name` on `net` (each test its own, so they never meet), under
/// `timeout -k 5 LIMIT` when a limit is given.
fn netlab(name: &str, net: &str, limit_s: Option<u64>) -> Command {
    let mut c = match limit_s {
        Some(l) => {
            let mut c = Command::new("timeout");
            c.args(["-k", "5", &l.to_string(), WAN_SH]);
            c
        }
        None => Command::new(WAN_SH),
    };
    c.env("NETLAB_NAME", name).env("NETLAB_NET", net).env("BIN", bin());
    c
}

fn wan(args: &[&str]) -> std::process::Output {
    netlab("tst", "10.78.0", None).args(args).output().expect("netlab/wan.sh runs")
}

fn json(out: &std::process::Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().last().unwrap_or_else(|| panic!("no output: {}", String::from_utf8_lossy(&out.stderr)));
    serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[test]
fn gaia_over_delayed_shaped_namespaces() {
    let check = wan(&["check"]);
    if check.status.code() == Some(3) {
        eprintln!("SKIPPED gaia_over_delayed_shaped_namespaces: {}", String::from_utf8_lossy(&check.stderr).trim());
        return;
    }
    assert!(check.status.success(), "netlab check: {}", String::from_utf8_lossy(&check.stderr));
    let dir = scratch("netlab");
    let m = dir.join("m.jsonl");
    let data = format!("{FASHION}/t10k-images-idx3-ubyte.gz");
    // up, ping, the run, the counters, down.
    let _ = std::fs::remove_file(&m);
    let up = wan(&["up", "2", "1", "100mbit", &format!("{DELAY_MS}ms")]);
    assert!(up.status.success(), "netlab up: {}", String::from_utf8_lossy(&up.stderr));
    let ping = wan(&["ping", "0", "1", "5"]);
    let run = netlab("tst", "10.78.0", Some(120))
        .args([
            "run",
            "4",
            "train",
            "--data",
            &data,
            "--epochs",
            "2",
            "--batch-size",
            "64",
            "--sync",
            "gaia",
            "--groups",
            "2",
            "--significance",
            "0.01",
            "--dc-staleness",
            "0",
            "--metrics",
            s(&m),
        ])
        .output()
        .unwrap();
    // On failure the link's and the hosts' kernel counters and sockets go with the message. This
    // test once failed in 3 of 10 whole-suite runs beside two CPU burners, all second runs of a
    // session ("failed to TCP connect to a peer MPI process", then a hang to the timeout), and
    // got a second launch for it. The cause (issue 27): the report test, earlier in the first run,
    // left the session's autogroup at nice -20 (benches/priority.sh, now fixed), so in the next
    // run host 0's ranks out-weighed host 1's, which Open MPI's daemon starts in a session of
    // its own at nice 0: they got no CPU. The second launch is gone with the cause; `wan.sh run`
    // warns when the caller's group is not at 0.
    let stats = wan(&["stats"]);
    let down = wan(&["down"]);
    assert!(
        run.status.success(),
        "mpirun across namespaces failed ({}):\n{}\nnetlab stats: {}",
        run.status,
        String::from_utf8_lossy(&run.stderr),
        String::from_utf8_lossy(&stats.stdout)
    );
    assert!(down.status.success(), "netlab down: {}", String::from_utf8_lossy(&down.stderr));
    let names = Command::new("ip").args(["netns", "list"]).output().unwrap();
    assert!(!String::from_utf8_lossy(&names.stdout).contains("gaia-tst-"), "namespaces left behind");
    assert!(!std::path::Path::new("/tmp/netlab-tst").exists(), "state directory left behind");

    // The delay: every round trip between the groups is at least 2 x the one-way delay.
    assert!(ping.status.success(), "netlab ping: {}", String::from_utf8_lossy(&ping.stderr));
    let rtt = json(&ping)["rtt_ms_min"].as_f64().unwrap();
    assert!(rtt >= 2.0 * DELAY_MS, "round trip {rtt} ms < 2 x {DELAY_MS} ms");

    let sm = summary(&m);
    let g = &sm["sync_metrics"];
    let wan_sent = g["wan_bytes_sent"].as_f64().unwrap();
    assert!(wan_sent > 0.0 && g["significant_updates"].as_f64().unwrap() < g["updates"].as_f64().unwrap(), "{g}");
    assert!(g["final_group_disagreement"].as_f64().unwrap() < 1e-4, "{g}");
    // DS = 0 over the delayed link: T clocks take at least (T - 1) one-way delays.
    let rounds = sm["rounds"].as_f64().unwrap();
    let train = sm["train_seconds"].as_f64().unwrap();
    assert!(rounds >= 20.0, "{sm}");
    assert!(train >= (rounds - 1.0) * DELAY_MS / 1e3, "{rounds} clocks in {train} s: faster than the delay allows");
    assert_eq!(g["mirror_lag_max"].as_f64().unwrap(), 0.0, "{g}");

    // The kernel's counters: each group's two ranks sent about half the WAN payload (two mirror
    // shards per group, equal in size); its tap carried at least that (plus headers and MPI's
    // own traffic). The relay dropped nothing it was not allowed to (drops are TCP's business).
    let st = json(&stats);
    for tap in st["taps"].as_array().unwrap() {
        let b = tap["out_bytes"].as_f64().unwrap();
        assert!(b >= 0.45 * wan_sent, "group {}: the link carried {b} B out, the program sent {wan_sent} B across groups", tap["group"]);
    }
    let relay = &st["relay"];
    assert_eq!(relay["delay_ms"].as_f64().unwrap(), DELAY_MS, "{relay}");
    let frames: f64 = relay["links"].as_array().unwrap().iter().map(|l| l["frames"].as_f64().unwrap()).sum();
    assert!(frames > 0.0, "{relay}");
    // Gaia over a delayed link: the schedule decides which updates cross when (see `TRAINED`).
    assert!(sm["final_metric"].as_f64().unwrap() > TRAINED, "{sm}");
}

/// `netlab/wan.sh hosts` (issue 41 item 3): three hosts, each behind a link of its own to one
/// switch, one of them slower and farther. The oracles are the links themselves: a round trip
/// between two hosts takes at least twice the sum of their one-way delays; one TCP stream cannot
/// carry more than the slower end's rate (upper bounds only: load makes links slower, never
/// faster); each host's link carried at least the bytes that crossed it (the stream's payload,
/// the program's own count of what its rank sent); in every 1 s window each host's link, both
/// ways, carried at most its rate's bytes (plus what the relay's own lateness and one frame
/// allow: the relay's measurement of when frames actually left, against its own clock of when
/// they were due); and an MPI job runs across the three.
#[test]
fn hosts_behind_links_of_their_own() {
    let hosts = |args: &[&str]| netlab("tsh", "10.81.0", None).args(args).output().expect("netlab/wan.sh runs");
    let check = hosts(&["check"]);
    if check.status.code() == Some(3) {
        eprintln!("SKIPPED hosts_behind_links_of_their_own: {}", String::from_utf8_lossy(&check.stderr).trim());
        return;
    }
    let dir = scratch("netlab-hosts");
    let m = dir.join("m.jsonl");
    let _ = std::fs::remove_file(&m);
    // (Mbit/s, one-way ms) of hosts 0, 1, 2.
    let links = [(40.0, 2.0), (40.0, 2.0), (8.0, 5.0)];
    let up = hosts(&["hosts", "40mbit/2ms", "40mbit/2ms", "8mbit/5ms"]);
    assert!(up.status.success(), "netlab hosts: {}", String::from_utf8_lossy(&up.stderr));
    let pings = [hosts(&["ping", "0", "1", "5"]), hosts(&["ping", "0", "2", "5"])];
    let bulks = [hosts(&["bulk", "0", "1", "4"]), hosts(&["bulk", "0", "2", "2"])];
    let data = format!("{FASHION}/t10k-images-idx3-ubyte.gz");
    let run = netlab("tsh", "10.81.0", Some(120))
        .args(["run", "3", "train", "--data", &data, "--epochs", "1", "--sync", "allreduce", "--sync-every", "16", "--metrics", s(&m)])
        .output()
        .unwrap();
    let stats = hosts(&["stats"]);
    let down = hosts(&["down"]);
    assert!(
        run.status.success(),
        "mpirun across the hosts failed:\n{}\nnetlab stats: {}",
        String::from_utf8_lossy(&run.stderr),
        String::from_utf8_lossy(&stats.stdout)
    );
    assert!(down.status.success(), "netlab down: {}", String::from_utf8_lossy(&down.stderr));

    for (to, ping) in [1, 2].into_iter().zip(&pings) {
        assert!(ping.status.success(), "netlab ping 0 {to}: {}", String::from_utf8_lossy(&ping.stderr));
        let rtt = json(ping)["rtt_ms_min"].as_f64().unwrap();
        let floor = 2.0 * (links[0].1 + links[to].1);
        assert!(rtt >= floor, "host 0 -> {to}: round trip {rtt} ms < 2 x ({} + {}) ms", links[0].1, links[to].1);
    }
    for ((to, mb), bulk) in [(1, 4.0), (2, 2.0)].into_iter().zip(&bulks) {
        assert!(bulk.status.success(), "netlab bulk 0 {to}: {}", String::from_utf8_lossy(&bulk.stderr));
        let b = json(bulk);
        assert_eq!(b["bytes"].as_f64().unwrap(), mb * 1048576.0, "{b}");
        let cap = f64::min(links[0].0, links[to].0);
        // The sink times from its first byte, and a first frame the relay released late shortens
        // its interval: 5 % of room (the relay ran at most 2.4 ms late here, under SCHED_FIFO).
        assert!(b["mbit_s"].as_f64().unwrap() <= cap * 1.05, "host 0 -> {to}: {b} over a {cap} Mbit/s path");
    }
    let st = json(&stats);
    let relay = st["relay"]["hosts"].as_array().unwrap_or_else(|| panic!("{st}"));
    assert_eq!(relay.len(), 3, "{st}");
    let sent = summary(&m)["counters"]["bytes_sent"]["max"].as_f64().unwrap();
    assert!(sent > 0.0);
    for (h, l) in relay.iter().enumerate() {
        assert_eq!((l["rate_mbit"].as_f64().unwrap(), l["delay_ms"].as_f64().unwrap()), links[h], "{l}");
        // One rank per host: its link carried at least what the rank sent.
        assert!(l["out_bytes"].as_f64().unwrap() >= sent, "host {h}: {l}, the rank sent {sent} B");
    }
    assert!(relay[2]["in_bytes"].as_f64().unwrap() >= 2.0 * 1048576.0, "{st}");
    // Every 1 s window (issue 41): a link of R bytes/s whose frames left at most `late` s after
    // their due time carries at most R x (1 s + late) in any second, plus the one frame (at most
    // 64 KiB, the tap's largest read) whose serialisation began before the window.
    let late_ms = f64::max(st["relay"]["late_max_ms"].as_f64().unwrap(), st["relay"]["uplink_late_max_ms"].as_f64().unwrap());
    for (h, l) in relay.iter().enumerate() {
        let cap = links[h].0 * 1e6 / 8.0 * (1.0 + late_ms / 1e3) + 65536.0;
        for side in ["out_max_1s_bytes", "in_max_1s_bytes"] {
            let most = l[side].as_f64().unwrap_or_else(|| panic!("host {h}: no {side} in {l}"));
            assert!(most > 0.0, "host {h}: its link carried nothing in any second: {l}");
            assert!(
                most <= cap,
                "host {h}: {side} {most} B > {cap:.0} B ({} Mbit/s for 1 s + {late_ms:.1} ms late + a frame): {l}",
                links[h].0
            );
        }
    }
}
