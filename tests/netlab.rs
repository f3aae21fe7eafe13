//! `--sync gaia` across real hosts: 2 groups x 1 host (network namespaces), 2 ranks per host,
//! the link between the groups rate-shaped by tc (netlab/wan.sh). Skipped, with the reason,
//! where namespaces cannot be made (not root, no CAP_NET_ADMIN, no tc).
//!
//! The oracle is the kernel: the bytes its shaped class carried out of each host must hold at
//! least the WAN payload the program says that host's ranks sent, and nothing but the links
//! between groups is shaped.

mod common;
use common::*;
use std::process::Command;

fn wan(args: &[&str]) -> std::process::Output {
    Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/netlab/wan.sh"))
        .args(args)
        .env("NETLAB_NAME", "awtst")
        .env("NETLAB_NET", "10.78.0")
        .env("BIN", bin())
        .output()
        .expect("netlab/wan.sh runs")
}

/// Bytes the shaped class of host `h` has sent (tc -s class show).
fn shaped_bytes(h: usize) -> u64 {
    let out = Command::new("ip").args(["netns", "exec", &format!("awtst-h{h}"), "tc", "-s", "class", "show", "dev", "eth0"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let sent = text.split_whitespace().skip_while(|w| *w != "Sent").nth(1).unwrap_or_else(|| panic!("no Sent in {text}"));
    sent.parse().unwrap()
}

#[test]
fn gaia_over_shaped_namespaces() {
    let check = wan(&["check"]);
    if check.status.code() == Some(3) {
        eprintln!("SKIPPED gaia_over_shaped_namespaces: {}", String::from_utf8_lossy(&check.stderr).trim());
        return;
    }
    assert!(check.status.success(), "netlab check: {}", String::from_utf8_lossy(&check.stderr));
    let up = wan(&["up", "2", "1", "100mbit", "0ms"]);
    assert!(up.status.success(), "netlab up: {}", String::from_utf8_lossy(&up.stderr));
    let dir = scratch("netlab");
    let m = dir.join("m.jsonl");
    let data = format!("{FASHION}/t10k-images-idx3-ubyte.gz");
    let run = Command::new("timeout")
        .args(["-k", "5", "120", concat!(env!("CARGO_MANIFEST_DIR"), "/netlab/wan.sh"), "run", "4", "train", "--data", &data,
            "--epochs", "2", "--batch-size", "64", "--sync", "gaia", "--groups", "2", "--significance", "0.01", "--metrics", s(&m)])
        .env("NETLAB_NAME", "awtst")
        .env("NETLAB_NET", "10.78.0")
        .env("BIN", bin())
        .output()
        .unwrap();
    let shaped = [shaped_bytes(0), shaped_bytes(1)];
    let down = wan(&["down"]);
    assert!(run.status.success(), "mpirun across namespaces failed:\n{}", String::from_utf8_lossy(&run.stderr));
    assert!(down.status.success(), "netlab down: {}", String::from_utf8_lossy(&down.stderr));
    let names = Command::new("ip").args(["netns", "list"]).output().unwrap();
    assert!(!String::from_utf8_lossy(&names.stdout).contains("awtst-"), "namespaces left behind");
    let sm = summary(&m);
    let g = &sm["sync_metrics"];
    let wan_sent = g["wan_bytes_sent"].as_f64().unwrap();
    assert!(wan_sent > 0.0 && g["significant_updates"].as_f64().unwrap() < g["updates"].as_f64().unwrap(), "{g}");
    assert!(g["final_group_disagreement"].as_f64().unwrap() < 1e-4, "{g}");
    // Each host's two ranks sent about half the WAN payload (two mirror shards per group, equal
    // in size): the kernel's shaped class carried at least that (plus headers and MPI's own).
    for (h, &b) in shaped.iter().enumerate() {
        assert!(b as f64 >= 0.45 * wan_sent, "host {h}: shaped class sent {b} B, the program sent {wan_sent} B across groups");
    }
    assert!(sm["final_metric"].as_f64().unwrap() > 0.7, "{sm}");
}
