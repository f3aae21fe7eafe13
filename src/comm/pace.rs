//! Rate limiting of one rank's outgoing bytes: a leaky bucket that drains at a fixed rate.
//!
//! Two users: `--emulate-bandwidth` (every mode: the rank's link is made as slow as a real one of
//! that rate, so bandwidth-bound comparisons can run on one machine) and the bandwidth budget of
//! `--sync bosen` (the rank spends at most that rate). Both are the same model: a message of b
//! bytes occupies the link for b / rate seconds after the link is free, and the next one starts
//! when it is done (Bosen §3.3.1: the bucket leaks at the budget's rate, a send is allowed when
//! it is empty). Optionally every message also arrives `latency` after it left.
//!
//! The bucket only computes times; callers either sleep until then (blocking sends: collectives,
//! one-sided puts) or hold the message back until then (`Postbox` in postbox.rs, which uses this
//! module, so it is named, not linked). Every send can be logged (time since start, bytes) for
//! checking the rate afterwards.

use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::grouplink::{group_of, GroupLink};

/// A per-rank value of an emulated link (`--emulate-bandwidth 1000,0-1:100`: every rank at 1000,
/// ranks 0 and 1 at 100; the same form for `--emulate-latency`). Parsed without knowing the rank
/// count; [`LinkSpec::resolve`] checks the ranks against it. Written back as the text it was
/// given, so configuration files and metrics keep the form the user wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct LinkSpec {
    /// The value of every rank not listed.
    pub default: f64,
    /// `(first rank, last rank, value)`, later entries winning.
    pub overrides: Vec<(usize, usize, f64)>,
    text: String,
}

impl LinkSpec {
    /// Parses `VALUE[,RANKS:VALUE]...` with RANKS a rank or a range `A-B`. Values must be finite
    /// and at least `min` (exclusive when `min_exclusive`): rates > 0, latencies >= 0.
    pub fn parse(text: &str, what: &str, min: f64, min_exclusive: bool) -> Result<LinkSpec, String> {
        let hint = format!("expected {what} as VALUE[,RANKS:VALUE]... (e.g. 1000,0-1:100: every rank 1000, ranks 0-1 100)");
        let value = |v: &str| -> Result<f64, String> {
            let x: f64 = v.trim().parse().map_err(|_| format!("{hint}; {v:?} is not a number"))?;
            let ok = x.is_finite() && if min_exclusive { x > min } else { x >= min };
            if !ok {
                let rel = if min_exclusive { ">" } else { ">=" };
                return Err(format!("{hint}; {v:?} must be finite and {rel} {min}"));
            }
            Ok(x)
        };
        let mut parts = text.split(',');
        let first = parts.next().unwrap_or("");
        let default = value(first)?;
        let mut overrides = Vec::new();
        for part in parts {
            let (ranks, v) = part.split_once(':').ok_or_else(|| format!("{hint}; {part:?} has no RANKS:VALUE"))?;
            let rank = |x: &str| -> Result<usize, String> { x.trim().parse().map_err(|_| format!("{hint}; bad rank {x:?} in {part:?}")) };
            let (a, b) = match ranks.split_once('-') {
                Some((a, b)) => (rank(a)?, rank(b)?),
                None => (rank(ranks)?, rank(ranks)?),
            };
            if a > b {
                return Err(format!("{hint}; the range {ranks:?} is empty"));
            }
            overrides.push((a, b, value(v)?));
        }
        Ok(LinkSpec { default, overrides, text: text.trim().to_string() })
    }

    /// One value for every rank.
    pub fn uniform(v: f64) -> LinkSpec {
        LinkSpec { default: v, overrides: Vec::new(), text: format!("{v}") }
    }

    /// The value of each of `n` ranks; an override naming a rank >= n is an error (`what` names
    /// the option).
    pub fn resolve(&self, n: usize, what: &str) -> anyhow::Result<Vec<f64>> {
        let mut v = vec![self.default; n];
        for &(a, b, x) in &self.overrides {
            anyhow::ensure!(b < n, "{what} {}: rank {b} is outside this job's ranks 0..{}", self.text, n.saturating_sub(1));
            v[a..=b].iter_mut().for_each(|y| *y = x);
        }
        Ok(v)
    }

    /// Every value multiplied by `f` (a dilated cluster: times up, rates down).
    pub fn scaled(&self, f: f64) -> LinkSpec {
        let overrides: Vec<(usize, usize, f64)> = self.overrides.iter().map(|&(a, b, v)| (a, b, v * f)).collect();
        let mut text = format!("{}", self.default * f);
        for (a, b, v) in &overrides {
            text.push_str(&if a == b { format!(",{a}:{v}") } else { format!(",{a}-{b}:{v}") });
        }
        LinkSpec { default: self.default * f, overrides, text }
    }

    /// True when every rank has the same value.
    pub fn is_uniform(&self) -> bool {
        self.overrides.iter().all(|o| o.2 == self.default)
    }
}

impl std::fmt::Display for LinkSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl serde::Serialize for LinkSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // A uniform value stays a number (older metrics files and plots read it as one).
        if self.overrides.is_empty() {
            s.serialize_f64(self.default)
        } else {
            s.serialize_str(&self.text)
        }
    }
}

impl<'de> serde::Deserialize<'de> for LinkSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(f64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Number(x) => LinkSpec::parse(&format!("{x}"), "a link value", 0.0, false).map_err(serde::de::Error::custom),
            Raw::Text(t) => LinkSpec::parse(&t, "a link value", 0.0, false).map_err(serde::de::Error::custom),
        }
    }
}

/// `--emulate-fabric`: what carries the emulated links, so which costs of a real transport the
/// link model adds to its ideal pipe (issue 41 item 4, docs/emulation.md "Validation").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Fabric {
    /// An ideal pipe: a message takes its bytes over the line rate plus one latency (RDMA
    /// hardware comes closest). The model of every emulated table before `--emulate-fabric`.
    #[default]
    Ideal,
    /// Open MPI over TCP/Ethernet (what netlab's real links run): the line rate carries payload
    /// at 1448/1514 (TCP/IP and Ethernet headers of a full frame), a two-sided message over
    /// the TCP eager limit the real links run with (4 MiB) waits a round trip for the receiver's reply before
    /// the rest of it goes (the rendezvous), and one-sided puts (UCX over TCP) wait a fixed
    /// time and round trips and move at about half the payload rate (fitted over netlab).
    /// Two-sided messages (and the all-reduce ring's steps) go through each path's congestion
    /// window in slow start ([`TcpWindow`]), and move at the two-way share of the rate while
    /// the receiver's own link sends too ([`tcp_two_way_share`]: the receiver's acknowledgements
    /// wait behind its data); one-sided puts keep their fitted costs, which were measured with
    /// both.
    Tcp,
}

/// TCP payload per byte on the wire for a full Ethernet frame: 1448 bytes of payload (MTU 1500
/// less 20 IP, 20 TCP and 12 of timestamps) in 1514 bytes (with the 14-byte Ethernet header,
/// what netlab's relay serialises). Measured through the relay at 100 Mbit/s: one stream 91.8
/// and 94.5 Mbit/s of payload (`netlab/wan.sh bulk`), this ratio 95.6.
pub const TCP_PAYLOAD_SHARE: f64 = 1448.0 / 1514.0;

/// The TCP eager limit the real links run with: netlab/wan.sh sets Open MPI's
/// `btl_tcp_eager_limit` (and `rndv_eager_limit`) to 4 MiB (NETLAB_EAGER; Open MPI's default is
/// 64 KiB, under which a 0.3 MB gaia message crossed at ~45 % of the link, docs/gaia.md). A
/// longer two-sided message sends this much, then waits for the receiver's acknowledgement (one
/// round trip) before the rest.
pub const TCP_EAGER_BYTES: u64 = 4 << 20;

/// What a one-sided put costs over UCX's TCP transport beyond the ideal pipe's one latency:
/// put, flush, NOTIFY and ACK are software round trips, progressed only when the target enters
/// MPI, so a put waits a fixed time and more latencies ([`TCP_ONE_SIDED_EXTRA_MS`] +
/// [`TCP_ONE_SIDED_EXTRA_LATENCIES`] one-way latencies) and moves its bytes at a share of the
/// payload rate ([`TCP_ONE_SIDED_RATE_SHARE`]). Fitted on benches/emulation-links.sh's
/// asap --transport rma rows of 2026-11-29 20:00 UTC at load 4-6 (100 Mbit/s, one put a round,
/// netlab with the relay's timer at microseconds, cubic and both hosts' ranks at one priority;
/// extra = real minus the ideal pipe's seconds over 40 or 20 rounds): MLR at 1 ms one way
/// 16.6 ms a round, at 10 ms 137.0 ms, so 2.4 ms + 13.4 latencies; MLP 3.3 MB at 1 ms 98.4 ms,
/// of which 15.8 are those and 82.6 the bytes beyond the payload rate's 272 ms: a share of
/// 272 / 355 = 0.77. The 10 ms bandwidth-bound row is the check outside
/// the fit. The first fit (84.3 ms + 10.5 latencies at 0.47 of the rate, at load 9-10, on
/// netlab before those fixes) read the real rma round at 1 ms 3.5x too slow once they were in.
/// This transport's cost moves with the load (UCX progresses a put only when the target calls
/// into MPI).
pub const TCP_ONE_SIDED_EXTRA_MS: f64 = 2.4;

/// See [`TCP_ONE_SIDED_EXTRA_MS`].
pub const TCP_ONE_SIDED_EXTRA_LATENCIES: f64 = 13.4;

/// See [`TCP_ONE_SIDED_EXTRA_MS`].
pub const TCP_ONE_SIDED_RATE_SHARE: f64 = 0.77;

/// TCP's maximum segment: the payload of a full Ethernet frame (MTU 1500 less 20 IP, 20 TCP and
/// 12 bytes of timestamps), [`TCP_PAYLOAD_SHARE`]'s numerator.
pub const TCP_MSS: f64 = 1448.0;

/// Linux's initial congestion window in segments (`TCP_INIT_CWND`, RFC 6928): a new
/// connection, and one restarted after idle, sends this much in its first round trip.
pub const TCP_INITIAL_WINDOW_SEGMENTS: f64 = 10.0;

/// Linux's floor of the retransmission timeout (`TCP_RTO_MIN`, 200 ms). The kernel's RTO is the
/// smoothed RTT plus `rttvar`, which it never lets fall under this floor (tcp_rtt_estimator
/// resets `mdev_max` to `tcp_rto_min` each round trip), so on a steady path RTO = RTT + 200 ms:
/// 202 ms at 1 ms one way, 1.0 s across netlab's 400 ms WAN.
pub const TCP_RTO_MIN_SECONDS: f64 = 0.2;

/// The retransmission timeout of a path of round trip `rtt` seconds ([`TCP_RTO_MIN_SECONDS`]).
pub fn tcp_rto(rtt: f64) -> f64 {
    rtt + TCP_RTO_MIN_SECONDS
}

/// The share of its payload rate a TCP connection keeps while the receiver's own link is sending
/// too (two-way bulk traffic), at one-way latencies of 1 ms and up to 10 ms
/// ([`tcp_two_way_share`]). The receiver's acknowledgements queue behind its own data in its
/// link's buffer, so the sender's window, clocked by them, covers less of the path than the
/// path's product. Measured in netlab's relay trace (benches/two-way-share.sh: 2 hosts at
/// 100 Mbit/s, cubic, the relay's drop-tail buffer of 2 x delay + 20 ms; 3.3 MB messages, 10 rounds,
/// 2026-11-29 22:30-22:45 UTC): in 20 ms bins where both directions carried data, each carried
/// 0.87 (the ring) and 0.90 (asap p2p) of the payload rate at 1 ms one way; at 10 ms 0.74 (the
/// ring), 0.77 (asap p2p), 0.81 (ssp) and 0.75 (gaia); one way alone 0.94-1.00. On bbr (paced,
/// its queue stays short) 0.98 at 10 ms: this is cubic's, Linux's default, as netlab runs.
pub const TCP_TWO_WAY_SHARE_1MS: f64 = 0.88;

/// See [`TCP_TWO_WAY_SHARE_1MS`]: the share at 10 ms one way and longer.
pub const TCP_TWO_WAY_SHARE_10MS: f64 = 0.76;

/// [`TCP_TWO_WAY_SHARE_1MS`] for a path of one-way `latency`: linear between the two measured
/// latencies, and the nearer one's outside them (not measured there: netlab's WAN at 400 ms and
/// a LAN under 1 ms take the 10 ms and 1 ms shares).
pub fn tcp_two_way_share(latency: Duration) -> f64 {
    let f = ((latency.as_secs_f64() * 1e3 - 1.0) / 9.0).clamp(0.0, 1.0);
    TCP_TWO_WAY_SHARE_1MS + (TCP_TWO_WAY_SHARE_10MS - TCP_TWO_WAY_SHARE_1MS) * f
}

/// One TCP connection's congestion window in one direction (sender to receiver: the window is
/// the sender's, one per connection, and Open MPI's TCP transport opens one connection per pair
/// of ranks, so a rank's messages to one peer share it and those to another do not). What
/// `--emulate-fabric tcp` adds for slow start (issue 41 items 4 and 6): across netlab's WAN (12.5
/// Mbit/s, 800 ms round trip) one stream of 2 MiB reached 2.76 Mbit/s of 12.5 (`netlab/wan.sh
/// bulk 0 4 2`, docs/emulation.md); this model gives 2.72 ([`TcpWindow::send`]'s test).
///
/// The model: the window `w` (bytes) sends `w` in one round trip while it is under the path's
/// bandwidth-delay product (rate x RTT) and doubles each round trip (slow start: every acked
/// byte adds one); from the product up the path is full and bytes leave at the rate. A message
/// that ends inside a round leaves the window grown by what that round sent. A path idle for
/// more than an RTO ([`tcp_rto`]) restarts as Linux's `tcp_cwnd_restart` (RFC 2861,
/// `tcp_slow_start_after_idle` = 1, netlab's default): the window halves once for every RTO
/// of the idle time after the first, and never falls under the initial window
/// ([`TCP_INITIAL_WINDOW_SEGMENTS`]); after a compute phase of many RTOs that is the initial
/// window again. Left out: the connection's handshake (one round trip before the first message
/// on a pair), loss (the window is capped at the product, where a real one grows on into the
/// queue until a drop), and delayed ACKs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TcpWindow {
    /// The congestion window, bytes.
    cwnd: f64,
    /// When the last byte sent left (seconds on the caller's clock); None before the first.
    last_sent: Option<f64>,
}

impl Default for TcpWindow {
    fn default() -> Self {
        TcpWindow::new()
    }
}

impl TcpWindow {
    /// A new connection's window: the initial window.
    pub fn new() -> Self {
        TcpWindow { cwnd: TCP_INITIAL_WINDOW_SEGMENTS * TCP_MSS, last_sent: None }
    }

    /// The congestion window in bytes.
    pub fn cwnd(&self) -> f64 {
        self.cwnd
    }

    /// Linux's restart after idle for a send at `at` on a path of round trip `rtt`.
    fn restart(&mut self, at: f64, rtt: f64) {
        let Some(last) = self.last_sent else { return };
        let rto = tcp_rto(rtt);
        let mut idle = at - last;
        if idle <= rto {
            return;
        }
        let restart = self.cwnd.min(TCP_INITIAL_WINDOW_SEGMENTS * TCP_MSS);
        let mut w = self.cwnd;
        // while ((delta -= rto) > 0 && cwnd > restart_cwnd) cwnd >>= 1; (in whole segments)
        loop {
            idle -= rto;
            if idle <= 0.0 || w <= restart {
                break;
            }
            w = (w / TCP_MSS / 2.0).floor() * TCP_MSS;
        }
        self.cwnd = w.max(restart);
    }

    /// Sends `bytes` from `at` (seconds on any one clock) over a path of `rate` payload bytes
    /// per second and round trip `rtt` seconds: returns the seconds until its last byte has
    /// left (at least `bytes / rate`, exactly that once the window is full), and keeps the
    /// window for the next message on the path.
    pub fn send(&mut self, at: f64, bytes: u64, rate: f64, rtt: f64) -> f64 {
        self.restart(at, rtt);
        let bdp = rate * rtt;
        let (mut left, mut took, mut w) = (bytes as f64, 0.0, self.cwnd);
        while w < bdp && left > 0.0 {
            if left <= w {
                took += left / rate;
                w = (w + left).min(bdp);
                left = 0.0;
            } else {
                left -= w;
                took += rtt;
                w = (2.0 * w).min(bdp);
            }
        }
        took += left / rate;
        self.cwnd = w;
        self.last_sent = Some(at + took);
        took
    }
}

impl Fabric {
    /// The payload rate of a line of `bytes_per_second`.
    pub fn payload_rate(self, bytes_per_second: f64) -> f64 {
        match self {
            Fabric::Ideal => bytes_per_second,
            Fabric::Tcp => bytes_per_second * TCP_PAYLOAD_SHARE,
        }
    }

    /// What a two-sided message of `bytes` waits on top of its bytes over the `rate` (payload
    /// bytes per second) for a path of one-way `latency`: on TCP, a message over the eager limit
    /// waits a round trip for the rendezvous' reply, of which the eager part's own time on the
    /// link hides some.
    pub fn rendezvous(self, bytes: u64, rate: f64, latency: Duration) -> Duration {
        match self {
            Fabric::Tcp if bytes > TCP_EAGER_BYTES => (2 * latency).saturating_sub(Duration::from_secs_f64(TCP_EAGER_BYTES as f64 / rate)),
            _ => Duration::ZERO,
        }
    }

    /// The share of its payload rate a two-sided message keeps while the receiver's own link
    /// sends too, over a path of one-way `latency` ([`tcp_two_way_share`]; 1 on the ideal pipe).
    pub fn two_way_share(self, latency: Duration) -> f64 {
        match self {
            Fabric::Ideal => 1.0,
            Fabric::Tcp => tcp_two_way_share(latency),
        }
    }

    /// The rate a one-sided put's bytes get of a path's payload `rate`.
    pub fn one_sided_rate(self, rate: f64) -> f64 {
        match self {
            Fabric::Ideal => rate,
            Fabric::Tcp => rate * TCP_ONE_SIDED_RATE_SHARE,
        }
    }

    /// What a one-sided put waits on top of the ideal pipe's one latency over a path of
    /// one-way `latency`.
    pub fn one_sided_extra(self, latency: Duration) -> Duration {
        match self {
            Fabric::Ideal => Duration::ZERO,
            Fabric::Tcp => Duration::from_secs_f64(TCP_ONE_SIDED_EXTRA_MS / 1e3) + latency.mul_f64(TCP_ONE_SIDED_EXTRA_LATENCIES),
        }
    }
}

/// Every rank's emulated link: egress and ingress rate in payload bytes per second (full duplex,
/// the same speed both ways), one-way latency, and the fabric that carries them. With
/// [`Groups`] these are the WAN link between groups, and pairs within a group take the LAN.
#[derive(Clone, Debug, PartialEq)]
pub struct Links {
    pub bytes_per_second: Vec<f64>,
    pub latency: Vec<Duration>,
    pub fabric: Fabric,
    /// `--emulate-groups`: the ranks in groups (data centres) joined by shared WAN links.
    pub groups: Option<Groups>,
}

/// `--emulate-groups G`: the ranks in G equal groups of contiguous ranks. A pair within a group
/// talks over the LAN (every rank's own link, its NIC, at `lan_bytes_per_second`, `lan_latency`
/// one way); a pair across groups over the WAN: the per-rank links of [`Links`] (the path's rate
/// and latency, its TCP window) and the one link from the sender's group to the receiver's,
/// which the sending group's ranks share ([`GroupLink`], one FIFO at the WAN rate).
#[derive(Clone, Debug, PartialEq)]
pub struct Groups {
    pub count: usize,
    pub lan_bytes_per_second: f64,
    pub lan_latency: Duration,
}

impl Links {
    /// From per-rank Mbit/s (10^6 bits) and milliseconds, an ideal fabric.
    pub fn new(mbps: &[f64], latency_ms: &[f64]) -> Links {
        Links::on(Fabric::Ideal, mbps, latency_ms)
    }

    /// From per-rank line rates in Mbit/s (10^6 bits) and milliseconds over `fabric`: the
    /// rates are what the fabric carries of payload.
    pub fn on(fabric: Fabric, mbps: &[f64], latency_ms: &[f64]) -> Links {
        Links {
            bytes_per_second: mbps.iter().map(|m| fabric.payload_rate(m * 1e6 / 8.0)).collect(),
            latency: latency_ms.iter().map(|l| Duration::from_secs_f64(l / 1e3)).collect(),
            fabric,
            groups: None,
        }
    }

    /// These links as the WAN between `count` groups of contiguous ranks, whose pairs within a
    /// group talk over a LAN of `lan_mbps` (line rate, Mbit/s) and `lan_ms` one way.
    pub fn with_groups(mut self, count: usize, lan_mbps: f64, lan_ms: f64) -> Links {
        self.groups = Some(Groups {
            count,
            lan_bytes_per_second: self.fabric.payload_rate(lan_mbps * 1e6 / 8.0),
            lan_latency: Duration::from_secs_f64(lan_ms / 1e3),
        });
        self
    }

    /// True when `a` and `b` talk over a group's LAN (always false without groups).
    pub fn same_group(&self, a: usize, b: usize) -> bool {
        let n = self.bytes_per_second.len();
        self.groups.as_ref().is_some_and(|g| group_of(a, n, g.count) == group_of(b, n, g.count))
    }

    /// The rate of `rank`'s inbound link (its port): the LAN's with groups (a message across
    /// groups has already crossed the WAN when it comes in), its own link's without.
    pub fn inbound_rate(&self, rank: usize) -> f64 {
        self.groups.as_ref().map_or(self.bytes_per_second[rank], |g| g.lan_bytes_per_second)
    }
    /// The slowest rate of all ranks (what paces a ring or tree collective: every step waits for
    /// its slowest link) and the largest latency.
    pub fn slowest(&self) -> (f64, Duration) {
        let r = self.bytes_per_second.iter().copied().fold(f64::INFINITY, f64::min);
        let l = self.latency.iter().copied().max().unwrap_or_default();
        (r, l)
    }
    /// The rate of the path from `from` to `to`: the slower of the sender's egress and the
    /// receiver's ingress; the LAN's within a group.
    pub fn path_rate(&self, from: usize, to: usize) -> f64 {
        match &self.groups {
            Some(g) if self.same_group(from, to) => g.lan_bytes_per_second,
            _ => self.bytes_per_second[from].min(self.bytes_per_second[to]),
        }
    }

    /// The one-way latency of the path from `from` to `to`: the longer end's; the LAN's within
    /// a group.
    pub fn path_latency(&self, from: usize, to: usize) -> Duration {
        match &self.groups {
            Some(g) if self.same_group(from, to) => g.lan_latency,
            _ => self.latency[from].max(self.latency[to]),
        }
    }
}

/// A leaky bucket over one rank's outgoing bytes.
#[derive(Debug, Clone)]
pub struct Pacer {
    bytes_per_second: f64,
    latency: Duration,
    /// Per destination rank: the rate of the path there (the slower end), when links differ.
    path_rates: Option<Vec<f64>>,
    /// Per destination rank: the one-way latency of the path there (the longer end's).
    path_latency: Option<Vec<Duration>>,
    /// What carries the link (its costs beyond the ideal pipe's).
    fabric: Fabric,
    /// When the link has carried everything reserved so far.
    free_at: Instant,
    start: Instant,
    /// (seconds since start when the message entered the link, bytes), if recording.
    log: Option<Vec<(f64, u64)>>,
    /// On a TCP fabric: the congestion window of the path to each destination rank, and last
    /// the one of messages sent without a destination (the rank's own link: [`Pacer::reserve`]).
    windows: Vec<TcpWindow>,
    /// The reservations not yet begun when made: (start, path, its window before), so that
    /// [`Pacer::rewind`] restores the windows of the messages it takes back.
    undo: std::collections::VecDeque<(Instant, usize, TcpWindow)>,
    /// This rank (with per-rank links).
    rank: usize,
    /// `--emulate-groups`: the shared links between groups, which a message across groups takes
    /// after its own path ([`Pacer::reserve_to`]).
    group_link: Option<Rc<GroupLink>>,
    /// With `group_link`: per destination rank, when the path there has carried the last
    /// message across groups (a path is one TCP connection: its messages leave one by one).
    path_free: Vec<Instant>,
    /// The recent reservations' (start, end): when this rank's link was sending, which the
    /// acknowledgements of what it receives queue behind ([`Ingress::deliver_beside`]).
    sending: std::collections::VecDeque<(Instant, Instant)>,
}

/// How long [`Pacer::sending_within`] remembers a reservation after it ended: longer than any
/// inbound message's time on the link that is asked about.
const SENDING_MEMORY: Duration = Duration::from_secs(30);

impl Pacer {
    /// A link of `megabits_per_second` (10^6 bits) with a one-way `latency`.
    pub fn new(megabits_per_second: f64, latency: Duration) -> Self {
        assert!(megabits_per_second > 0.0 && megabits_per_second.is_finite(), "rate must be positive");
        let now = Instant::now();
        Pacer {
            bytes_per_second: megabits_per_second * 1e6 / 8.0,
            latency,
            path_rates: None,
            path_latency: None,
            fabric: Fabric::Ideal,
            free_at: now,
            start: now,
            log: None,
            windows: vec![TcpWindow::new()],
            undo: Default::default(),
            rank: 0,
            group_link: None,
            path_free: Vec::new(),
            sending: Default::default(),
        }
    }

    /// This rank's link within `links`: its own rate and latency, and a message to rank `d` is
    /// carried at the slower of the two ends (a 1 GbE sender to a 100 Mbit/s receiver sends at
    /// 100 Mbit/s). `budget_mbps` caps this rank's rate further (a mode's own budget). With
    /// groups the rank's own link is the LAN (its NIC), and a path across groups the WAN's;
    /// the shared link between the groups comes with [`Pacer::with_group_link`].
    pub fn for_rank(links: &Links, rank: usize, budget_mbps: Option<f64>) -> Self {
        let cap = budget_mbps.map_or(f64::INFINITY, |b| b * 1e6 / 8.0);
        let own = links.inbound_rate(rank).min(cap);
        let now = Instant::now();
        let n = links.bytes_per_second.len();
        let paths = (0..n).map(|d| links.path_rate(rank, d).min(cap)).collect();
        let lat = (0..n).map(|d| links.path_latency(rank, d)).collect();
        Pacer {
            bytes_per_second: own,
            latency: links.groups.as_ref().map_or(links.latency[rank], |g| g.lan_latency),
            path_rates: Some(paths),
            path_latency: Some(lat),
            fabric: links.fabric,
            free_at: now,
            start: now,
            log: None,
            windows: vec![TcpWindow::new(); n + 1],
            undo: Default::default(),
            rank,
            group_link: None,
            path_free: vec![now; n],
            sending: Default::default(),
        }
    }

    /// Takes messages across groups through `link` (`--emulate-groups`; None: no shared link,
    /// every path its own). Every rank of the job gets one or none.
    pub fn with_group_link(mut self, link: Option<Rc<GroupLink>>) -> Self {
        self.group_link = link;
        self
    }

    /// The group link when rank `dest` is in another group.
    fn across(&self, dest: usize) -> Option<Rc<GroupLink>> {
        self.group_link.as_ref().filter(|g| g.group(dest) != g.group(self.rank)).cloned()
    }

    /// A message of `bytes` to `dest` in another group, handed over at `now` (a one-sided
    /// `put`, or two-sided): it takes this rank's link (its NIC, at the LAN rate) in turn; its
    /// path (one connection) after the path's last message; and the group link (a FIFO at the
    /// WAN rate shared by the group's ranks, as the relay's queue is) for its bytes' time at
    /// that rate. Its last byte has left when both its path and the group link have carried it.
    /// Returns (start on this rank's link, end). The rank's own link is free again after the
    /// bytes' time at its rate, whatever the path and the WAN wait for (a connection waiting for
    /// its window holds no other connection's frames), so a message within the group never
    /// waits on the WAN.
    ///
    /// The group link is asked for the bytes' time ending no earlier than the path alone would
    /// end the message: in slow start a path sends most of its bytes in its last round trips
    /// (the window doubles each one), so messages that slow-start together meet on the shared
    /// link there, as flows do on a real one. Measured on the tcp twin of netlab's WAN
    /// (docs/emulation.md, "WAN over real netlab links"; NoLoCo k 16, gaia k 16; netlab 68.95
    /// and 37.78 s): taken from the path's start, slow start hid the link (four 814 kB gaia
    /// messages took it one after another in its first 2.2 s while their paths, each alone,
    /// still took 4.2 s: 64.98 and 31.24 s, gaia as without the link, 31.21); taken a window a
    /// round trip (each window one burst into the FIFO, the next round a round trip after the
    /// burst began), every burst queued behind all the others' in a queue without the relay's
    /// bound (820 ms) or its drops, and each wait lengthened that flow's round trips (NoLoCo
    /// 98.1 and 111.2 s); ending where the path alone ends, 78.26 and 40.88 s.
    fn reserve_across(&mut self, link: &GroupLink, dest: usize, bytes: u64, now: Instant, put: bool) -> (Instant, Instant) {
        let start = self.free_at.max(now);
        let path_start = start.max(self.path_free[dest]);
        let (rate, latency) = (self.path_rate(dest), self.latency_to(dest));
        let alone = match (self.fabric, put) {
            (Fabric::Tcp, false) => self.windowed(path_start, now, dest, bytes, rate, latency),
            (_, true) => bytes as f64 / self.fabric.one_sided_rate(rate),
            (Fabric::Ideal, false) => bytes as f64 / rate,
        };
        let wan = bytes as f64 / rate;
        let ready = path_start + Duration::from_secs_f64((alone - wan).max(0.0));
        let on_link = link
            .reserve(link.group(dest), ready, bytes, wan)
            .unwrap_or_else(|e| super::abort_job(&format!("rank {}: {e:#}", self.rank), 4));
        let rendezvous = if put { Duration::ZERO } else { self.fabric.rendezvous(bytes, rate, latency) };
        let end = (path_start + Duration::from_secs_f64(alone)).max(on_link.1) + rendezvous;
        self.path_free[dest] = end;
        self.free_at = start + Duration::from_secs_f64(bytes as f64 / self.bytes_per_second);
        self.note(start, end, bytes);
        link.record(now, start, end, bytes, dest, Some(on_link));
        (start, end)
    }

    /// Keeps a reservation from `start` to `end` of `bytes`: in the log when recording, and on
    /// a TCP fabric in what [`Pacer::sending_within`] looks at (only the two-way share asks).
    fn note(&mut self, start: Instant, end: Instant, bytes: u64) {
        if let Some(log) = &mut self.log {
            log.push(((start - self.start).as_secs_f64(), bytes));
        }
        if self.fabric != Fabric::Tcp {
            return;
        }
        while self.sending.front().is_some_and(|&(_, e)| e + SENDING_MEMORY < start) {
            self.sending.pop_front();
        }
        self.sending.push_back((start, end));
    }

    /// How long between `from` and `to` this rank's link was sending (reservations made so
    /// far on a TCP fabric; the union of their times, so paths sending at once count once).
    pub fn sending_within(&self, from: Instant, to: Instant) -> Duration {
        let mut spans: Vec<(Instant, Instant)> =
            self.sending.iter().map(|&(s, e)| (s.max(from), e.min(to))).filter(|(s, e)| s < e).collect();
        spans.sort();
        let (mut total, mut reach) = (Duration::ZERO, from);
        for (s, e) in spans {
            if e > reach {
                total += e - s.max(reach);
                reach = e;
            }
        }
        total
    }

    /// The rate of the path to rank `dest`.
    fn path_rate(&self, dest: usize) -> f64 {
        self.path_rates.as_ref().and_then(|p| p.get(dest).copied()).unwrap_or(self.bytes_per_second)
    }

    /// The one-way latency a round of messages to `dests` waits once (asap's one-sided puts):
    /// the longest path's with groups, this rank's own link's without.
    pub fn round_latency(&self, dests: &[usize]) -> Duration {
        match self.group_link {
            Some(_) => dests.iter().map(|&d| self.latency_to(d)).max().unwrap_or(self.latency),
            None => self.latency,
        }
    }

    /// Keeps a log of every reservation (see [`Pacer::log`]).
    pub fn record(mut self) -> Self {
        self.log = Some(Vec::new());
        self
    }

    /// The rate in bytes per second.
    pub fn bytes_per_second(&self) -> f64 {
        self.bytes_per_second
    }

    /// The one-way latency.
    pub fn latency(&self) -> Duration {
        self.latency
    }

    /// The fabric that carries the link.
    pub fn fabric(&self) -> Fabric {
        self.fabric
    }

    /// Puts `bytes` on the link as soon as it is free (not before `now`); returns when the link
    /// starts carrying them and when their last byte has left (not counting latency). A
    /// message the fabric holds up (a TCP rendezvous, a congestion window in slow start: the
    /// rank's own link's window, [`TcpWindow`]) holds the link that much longer.
    pub fn reserve_at(&mut self, bytes: u64, now: Instant) -> (Instant, Instant) {
        let own = self.windows.len() - 1;
        self.reserve_at_rate(bytes, now, self.bytes_per_second, self.latency, own)
    }

    /// [`Pacer::reserve_at`] at `rate` bytes per second (a path slower than this rank's link)
    /// over a path of one-way `latency`, whose TCP window is `windows[path]`.
    fn reserve_at_rate(&mut self, bytes: u64, now: Instant, rate: f64, latency: Duration, path: usize) -> (Instant, Instant) {
        let start = self.free_at.max(now);
        let on_link = match self.fabric {
            Fabric::Ideal => bytes as f64 / rate,
            Fabric::Tcp => self.windowed(start, now, path, bytes, rate, latency),
        };
        let end = start + Duration::from_secs_f64(on_link) + self.fabric.rendezvous(bytes, rate, latency);
        self.free_at = end;
        self.note(start, end, bytes);
        (start, end)
    }

    /// Seconds `bytes` from `start` take through the TCP window of `path` (rate, one-way
    /// latency), which keeps its state; remembered for [`Pacer::rewind`] (reservations made at
    /// `now`).
    fn windowed(&mut self, start: Instant, now: Instant, path: usize, bytes: u64, rate: f64, latency: Duration) -> f64 {
        while self.undo.front().is_some_and(|u| u.0 <= now) {
            self.undo.pop_front();
        }
        self.undo.push_back((start, path, self.windows[path]));
        let at = (start - self.start).as_secs_f64();
        self.windows[path].send(at, bytes, rate, 2.0 * latency.as_secs_f64())
    }

    /// [`Pacer::reserve_at`] now.
    pub fn reserve(&mut self, bytes: u64) -> (Instant, Instant) {
        self.reserve_at(bytes, Instant::now())
    }

    /// [`Pacer::reserve`] for a message to rank `dest`, at the rate of the path there.
    pub fn reserve_to(&mut self, dest: usize, bytes: u64) -> (Instant, Instant) {
        self.reserve_to_at(dest, bytes, Instant::now())
    }

    /// [`Pacer::reserve_to`] not before `now`. With groups, a message to another group also
    /// takes the group link ([`Pacer::with_group_link`]): it has left when both its path and
    /// the group link have carried it.
    pub fn reserve_to_at(&mut self, dest: usize, bytes: u64, now: Instant) -> (Instant, Instant) {
        let rate = self.path_rate(dest);
        let latency = self.latency_to(dest);
        let path = dest.min(self.windows.len() - 1);
        if let Some(link) = self.across(dest) {
            return self.reserve_across(&link, dest, bytes, now, false);
        }
        let (start, end) = self.reserve_at_rate(bytes, now, rate, latency, path);
        if let Some(link) = &self.group_link {
            link.record(now, start, end, bytes, dest, None);
        }
        (start, end)
    }

    /// A one-sided put of `bytes` to rank `dest`: when the link has delivered it, its last
    /// byte out plus the path's latency and what the fabric adds to a put
    /// ([`Fabric::one_sided_extra`]; no rendezvous: one-sided puts have none). Across groups
    /// it takes the group link too, as [`Pacer::reserve_to_at`].
    pub fn put_to(&mut self, dest: usize, bytes: u64) -> Instant {
        let rate = self.path_rate(dest);
        let latency = self.latency_to(dest);
        if let Some(link) = self.across(dest) {
            let (_, end) = self.reserve_across(&link, dest, bytes, Instant::now(), true);
            return end + latency + self.fabric.one_sided_extra(latency);
        }
        let start = self.free_at.max(Instant::now());
        let end = start + Duration::from_secs_f64(bytes as f64 / self.fabric.one_sided_rate(rate));
        self.free_at = end;
        self.note(start, end, bytes);
        end + latency + self.fabric.one_sided_extra(latency)
    }

    /// The one-way latency of the path to rank `dest` (the longer of the two ends').
    pub fn latency_to(&self, dest: usize) -> Duration {
        self.path_latency.as_ref().and_then(|l| l.get(dest).copied()).unwrap_or(self.latency)
    }

    /// [`Pacer::send_blocking`] to rank `dest`, at the rate of the path there.
    pub fn send_blocking_to(&mut self, dest: usize, bytes: u64) -> Duration {
        let (_, end) = self.reserve_to(dest, bytes);
        sleep_until(end)
    }

    /// Blocks (sleeping: the CPU is free for other ranks) until a link of this rate would have
    /// sent `bytes` more, and returns the time slept.
    pub fn send_blocking(&mut self, bytes: u64) -> Duration {
        let (_, end) = self.reserve(bytes);
        sleep_until(end)
    }

    /// Takes back the last `reservations` reservations, which had not begun: the link is free
    /// again from `to` (where the first of them would have started), and the log forgets them.
    /// A group link's reservations stay taken (other ranks may have reserved after them): a
    /// message taken back across groups leaves its time on the shared link unused.
    pub fn rewind(&mut self, to: Instant, reservations: usize) {
        self.free_at = to;
        if self.fabric == Fabric::Tcp {
            for _ in 0..reservations {
                let Some((_, path, before)) = self.undo.pop_back() else { break };
                self.windows[path] = before;
            }
        }
        if let Some(log) = &mut self.log {
            log.truncate(log.len().saturating_sub(reservations));
        }
        self.sending.truncate(self.sending.len().saturating_sub(reservations));
    }

    /// True when everything reserved has left (the bucket is empty): a send now starts at once.
    pub fn idle_at(&self, now: Instant) -> bool {
        self.free_at <= now
    }

    /// Bytes this link can still take on (at its own rate) and have sent by `now + horizon`:
    /// 0 when what is reserved already runs past it.
    pub fn room_within(&self, now: Instant, horizon: Duration) -> f64 {
        let until = now + horizon;
        let from = self.free_at.max(now);
        if until <= from {
            return 0.0;
        }
        (until - from).as_secs_f64() * self.bytes_per_second
    }

    /// The reservations so far: (seconds since the pacer was made, bytes).
    pub fn log(&self) -> &[(f64, u64)] {
        self.log.as_deref().unwrap_or(&[])
    }
}

/// One rank's inbound link: messages from every sender share it, one after another at its rate.
/// The sender's [`Pacer`] already carries a message at the slower end's rate, which models one
/// sender alone; when several send to one rank at once (a parameter-server shard, a rank with
/// many in-neighbours) the receiver's link is the bottleneck, and this queue models it. A message
/// that would have arrived at `arrival` (its last byte, had the receiver's link been free) takes
/// the link for its bytes at the receiver's rate, starting no earlier than the link is free; it
/// is delivered when its last byte is in. Alone, a message is delivered at `arrival`.
#[derive(Debug, Clone)]
pub struct Ingress {
    bytes_per_second: f64,
    free_at: Instant,
    start: Instant,
    /// (seconds since start when the message started coming in, bytes), if recording.
    log: Option<Vec<(f64, u64)>>,
}

impl Ingress {
    /// An inbound link of `bytes_per_second`.
    pub fn new(bytes_per_second: f64) -> Self {
        assert!(bytes_per_second > 0.0, "rate must be positive");
        let now = Instant::now();
        Ingress { bytes_per_second, free_at: now, start: now, log: None }
    }

    /// Keeps a log of every message taken in (see [`Ingress::log`]).
    pub fn record(mut self) -> Self {
        self.log = Some(Vec::new());
        self
    }

    /// When a message of `bytes` that would have arrived at `arrival` on a free link is in.
    pub fn deliver_at(&mut self, arrival: Instant, bytes: u64) -> Instant {
        self.take_in(arrival, bytes, None)
    }

    /// [`Ingress::deliver_at`] for a two-sided message from rank `source` on a receiver whose own
    /// link is `own`: on a TCP fabric, for as long as `own` was sending while the message's
    /// bytes came in, they move at the two-way share of the rate ([`Fabric::two_way_share`]: the
    /// receiver's acknowledgements wait behind its own data), so the message holds the inbound
    /// link that much longer and the ones after it queue behind. With the ideal pipe, or no
    /// pacer, as [`Ingress::deliver_at`].
    pub fn deliver_beside(&mut self, arrival: Instant, bytes: u64, own: Option<&Pacer>, source: usize) -> Instant {
        self.take_in(arrival, bytes, own.filter(|p| p.fabric() == Fabric::Tcp).map(|p| (p, source)))
    }

    /// Takes a message in (see [`Ingress::deliver_beside`]).
    fn take_in(&mut self, arrival: Instant, bytes: u64, beside: Option<(&Pacer, usize)>) -> Instant {
        let took = Duration::from_secs_f64(bytes as f64 / self.bytes_per_second);
        // `arrival - took` is when it would have started coming in; `Instant` cannot go before
        // the process's first instant, so clamp at the link's own start.
        let wanted = arrival.checked_sub(took).unwrap_or(self.start).max(self.start);
        let start = wanted.max(self.free_at);
        // The receiver's sends while the sender sent (a message is taken in at or after its
        // arrival, so every send of that time is reserved by then).
        let slower = beside.map_or(Duration::ZERO, |(p, source)| {
            let share = p.fabric().two_way_share(p.latency_to(source));
            p.sending_within(wanted, arrival).mul_f64(1.0 / share - 1.0)
        });
        let end = start + took + slower;
        self.free_at = end;
        if let Some(log) = &mut self.log {
            log.push(((start - self.start).as_secs_f64(), bytes));
        }
        end.max(arrival)
    }

    /// True while the link is still taking in messages at `now`.
    pub fn busy_at(&self, now: Instant) -> bool {
        self.free_at > now
    }

    /// The messages taken in so far: (seconds since the link was made, bytes).
    pub fn log(&self) -> &[(f64, u64)] {
        self.log.as_deref().unwrap_or(&[])
    }
}

/// A token bucket over one rank's outgoing bytes, for senders that choose what to send from what
/// the budget allows now instead of waiting for it (`--sync asap --bandwidth-mbps`: each round
/// sends only the rows that fit). Credit accrues at the rate up to `capacity`; a send spends it
/// and may overdraw it (the protocol's few mandatory bytes), which later sends then repay. Over
/// any window of T seconds the bytes spent are at most `capacity + rate * T` plus one overdraw.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    bytes_per_second: f64,
    capacity: f64,
    tokens: f64,
    at: Instant,
    start: Instant,
    log: Option<Vec<(f64, u64)>>,
}

impl TokenBucket {
    /// A full bucket of `capacity` bytes refilled at `megabits_per_second` (10^6 bits).
    pub fn new(megabits_per_second: f64, capacity: u64) -> Self {
        assert!(megabits_per_second > 0.0 && megabits_per_second.is_finite(), "rate must be positive");
        let now = Instant::now();
        TokenBucket {
            bytes_per_second: megabits_per_second * 1e6 / 8.0,
            capacity: capacity as f64,
            tokens: capacity as f64,
            at: now,
            start: now,
            log: None,
        }
    }

    /// Keeps a log of every spend (see [`TokenBucket::log`]).
    pub fn record(mut self) -> Self {
        self.log = Some(Vec::new());
        self
    }

    /// The rate in bytes per second.
    pub fn bytes_per_second(&self) -> f64 {
        self.bytes_per_second
    }

    /// Bytes that may be sent at `now` (0 while an overdraw is being repaid).
    pub fn available_at(&mut self, now: Instant) -> u64 {
        if now > self.at {
            let earned = (now - self.at).as_secs_f64() * self.bytes_per_second;
            self.tokens = (self.tokens + earned).min(self.capacity);
            self.at = now;
        }
        self.tokens.max(0.0) as u64
    }

    /// Spends `bytes` sent at `now` (possibly more than available: an overdraw).
    pub fn spend_at(&mut self, bytes: u64, now: Instant) {
        self.available_at(now);
        self.tokens -= bytes as f64;
        if let Some(log) = &mut self.log {
            log.push(((now - self.start).as_secs_f64(), bytes));
        }
    }

    /// The spends so far: (seconds since the bucket was made, bytes).
    pub fn log(&self) -> &[(f64, u64)] {
        self.log.as_deref().unwrap_or(&[])
    }
}

/// Wall-clock seconds since the epoch of an `Instant` (the stamp's clock is shared by the ranks
/// of one machine; `Instant`s are per process).
pub fn wall_seconds(t: Instant) -> f64 {
    let (now_i, now_w) = (Instant::now(), SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs_f64());
    if t >= now_i {
        now_w + (t - now_i).as_secs_f64()
    } else {
        now_w - (now_i - t).as_secs_f64()
    }
}

/// The `Instant` of wall-clock seconds `w` (clamped to now for times in the future beyond a
/// clock step, which a stamp from the same machine never is by more than its latency).
pub fn instant_of(w: f64) -> Instant {
    let (now_i, now_w) = (Instant::now(), SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs_f64());
    let d = w - now_w;
    if !d.is_finite() {
        return now_i;
    }
    if d >= 0.0 {
        now_i + Duration::from_secs_f64(d)
    } else {
        now_i.checked_sub(Duration::from_secs_f64(-d)).unwrap_or(now_i)
    }
}

/// Sleeps until `t` (no-op when it has passed); returns the time slept.
pub fn sleep_until(t: Instant) -> Duration {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
        now.elapsed()
    } else {
        Duration::ZERO
    }
}

/// The most bytes sent in any window of `window` seconds of a send log (sorted by time), as a
/// rate in bytes per second. Windows start at a send (the worst case for a step function).
pub fn peak_rate(log: &[(f64, u64)], window: f64) -> f64 {
    let mut best = 0u64;
    let mut sum = 0u64;
    let mut j = 0;
    for i in 0..log.len() {
        while j < log.len() && log[j].0 < log[i].0 + window {
            sum += log[j].1;
            j += 1;
        }
        best = best.max(sum);
        sum -= log[i].1;
    }
    best as f64 / window
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_specs_parse_resolve_and_refuse_bad_values() {
        let l = LinkSpec::parse("1000,0-1:100", "--emulate-bandwidth", 0.0, true).unwrap();
        assert_eq!(l.resolve(4, "x").unwrap(), vec![100.0, 100.0, 1000.0, 1000.0]);
        assert_eq!(l.to_string(), "1000,0-1:100");
        assert!(!l.is_uniform() && LinkSpec::uniform(5.0).is_uniform());
        assert!(l.resolve(2, "x").is_ok());
        let e = l.resolve(1, "--emulate-bandwidth").unwrap_err().to_string();
        assert!(e.contains("rank 1 is outside"), "{e}");
        // Later entries win.
        let l = LinkSpec::parse("10,0-3:5,2:7", "x", 0.0, true).unwrap();
        assert_eq!(l.resolve(5, "x").unwrap(), vec![5.0, 5.0, 7.0, 5.0, 10.0]);
        for bad in ["nan", "inf", "0", "-1", "10,1", "10,a:5", "10,3-1:5", "10,1:nan", ""] {
            assert!(LinkSpec::parse(bad, "x", 0.0, true).is_err(), "{bad}");
        }
        assert!(LinkSpec::parse("0", "x", 0.0, false).is_ok(), "a latency of 0 is fine");
        // Numbers and texts both read back from JSON.
        let a: LinkSpec = serde_json::from_str("100.0").unwrap();
        assert_eq!(a.default, 100.0);
        let b: LinkSpec = serde_json::from_str("\"1000,7:100\"").unwrap();
        assert_eq!(serde_json::to_string(&b).unwrap(), "\"1000,7:100\"");
        assert_eq!(serde_json::to_string(&a).unwrap(), "100.0");
    }

    /// With groups, a pair within a group takes the LAN and a pair across the WAN (the per-rank
    /// links); a rank's own link and its inbound port are the LAN. (The shared group link
    /// itself needs MPI: `tests/emulation.rs`.)
    #[test]
    fn groups_split_the_pairs_into_lan_and_wan() {
        let links = Links::new(&[8.0; 4], &[50.0; 4]).with_groups(2, 800.0, 0.5);
        let (wan, lan) = (1e6, 1e8);
        assert!(links.same_group(0, 1) && links.same_group(2, 3) && !links.same_group(1, 2));
        assert_eq!((links.path_rate(0, 1), links.path_rate(0, 2), links.path_rate(3, 0)), (lan, wan, wan));
        assert_eq!(links.path_latency(2, 3), Duration::from_micros(500));
        assert_eq!(links.path_latency(2, 1), Duration::from_millis(50));
        assert_eq!(links.inbound_rate(3), lan);
        let mut p = Pacer::for_rank(&links, 0, None);
        assert_eq!((p.bytes_per_second(), p.latency()), (lan, Duration::from_micros(500)));
        // No group link given: a message across takes its WAN path alone.
        let (s, e) = p.reserve_to(2, 10_000);
        assert_eq!(e - s, Duration::from_millis(10));
        assert_eq!(p.round_latency(&[1, 2]), Duration::from_micros(500), "no group link: the rank's own latency");
        // Without groups every pair takes the per-rank link, as before.
        let flat = Links::new(&[8.0; 4], &[50.0; 4]);
        assert_eq!((flat.path_rate(0, 1), flat.inbound_rate(0)), (wan, wan));
    }

    #[test]
    fn a_path_runs_at_its_slower_end() {
        let links = Links::new(&[1000.0, 100.0, 1000.0], &[0.0, 5.0, 0.0]);
        assert_eq!(links.slowest(), (100e6 / 8.0, Duration::from_millis(5)));
        let mut p = Pacer::for_rank(&links, 0, None);
        // 12,500 bytes at 100 Mbit/s = 1 ms; at 1000 Mbit/s 0.1 ms.
        let (s, e) = p.reserve_to(1, 12_500);
        assert_eq!(e - s, Duration::from_millis(1));
        let (s2, e2) = p.reserve_to(2, 12_500);
        assert_eq!(s2, e, "one egress queue");
        assert_eq!(e2 - s2, Duration::from_micros(100));
        // A budget caps every path.
        let mut p = Pacer::for_rank(&links, 2, Some(10.0));
        let (s, e) = p.reserve_to(0, 12_500);
        assert_eq!(e - s, Duration::from_millis(10));
    }

    #[test]
    fn a_tcp_fabric_carries_payload_at_its_share_and_waits_each_rendezvous() {
        // 8 Mbit/s of line = 1e6 bytes/s; on tcp 1e6 * 1448 / 1514 of payload.
        let ideal = Links::new(&[8.0, 8.0], &[50.0, 50.0]);
        let tcp = Links::on(Fabric::Tcp, &[8.0, 8.0], &[50.0, 50.0]);
        assert_eq!(ideal.bytes_per_second[0], 1e6);
        let rate = 1e6 * 1448.0 / 1514.0;
        assert_eq!(tcp.bytes_per_second, vec![rate, rate]);
        let secs = |d: Duration| d.as_secs_f64();
        // Up to the eager limit: the bytes over the payload rate, no wait, plus slow start: a
        // new connection's window (10 x 1448 B) doubles each 100 ms round trip until it holds
        // the path's 95.6 kB in flight (rate x RTT), which takes m = ceil(log2(BDP / IW)) = 3
        // round trips carrying IW (2^m - 1) bytes.
        let mut p = Pacer::for_rank(&tcp, 0, None).record();
        let (s, e) = p.reserve_to(1, TCP_EAGER_BYTES);
        let (iw, rtt) = (10.0 * 1448.0, 0.1);
        let m = (rate * rtt / iw).log2().ceil();
        assert_eq!(m, 3.0);
        let want = TCP_EAGER_BYTES as f64 / rate + m * rtt - iw * (2f64.powf(m) - 1.0) / rate;
        assert!((secs(e - s) - want).abs() < 1e-6, "{} against {want}", secs(e - s));
        // Right behind it on the same path the window is full: bytes over the rate.
        let (s2, e2) = p.reserve_to(1, TCP_EAGER_BYTES);
        assert_eq!(s2, e, "one egress queue");
        assert!((secs(e2 - s2) - TCP_EAGER_BYTES as f64 / rate).abs() < 1e-6);
        // Beyond the eager limit: plus a round trip less the eager part's own time on the link
        // (a 4 MiB eager part takes 4.4 s at this rate: a round trip of 5 s to see the wait).
        let big = TCP_EAGER_BYTES + 200_000;
        let wait = Fabric::Tcp.rendezvous(big, rate, Duration::from_millis(2500));
        assert!((secs(wait) - (5.0 - TCP_EAGER_BYTES as f64 / rate)).abs() < 1e-6);
        assert_eq!(Fabric::Tcp.rendezvous(TCP_EAGER_BYTES, rate, Duration::from_millis(2500)), Duration::ZERO);
        // A round trip shorter than the eager part's time costs nothing.
        assert_eq!(Fabric::Tcp.rendezvous(big, rate, Duration::from_millis(1)), Duration::ZERO);
        // The ideal fabric: the old model, exactly.
        let mut q = Pacer::for_rank(&ideal, 0, None);
        let (s, e) = q.reserve_to(1, 200_000);
        assert_eq!(e - s, Duration::from_millis(200));
        // A one-sided put: no rendezvous, the latency and the fabric's extra latencies.
        let t = Instant::now();
        let mut q = Pacer::for_rank(&tcp, 0, None);
        let arrival = q.put_to(1, 200_000);
        let want =
            200_000.0 / (rate * TCP_ONE_SIDED_RATE_SHARE) + TCP_ONE_SIDED_EXTRA_MS / 1e3 + 0.05 * (1.0 + TCP_ONE_SIDED_EXTRA_LATENCIES);
        assert!(secs(arrival - t) >= want - 1e-6 && secs(arrival - t) < want + 0.05, "{:?}", arrival - t);
        let mut q = Pacer::for_rank(&ideal, 0, None);
        let t = Instant::now();
        let arrival = q.put_to(1, 200_000);
        assert!(secs(arrival - t) >= 0.25 - 1e-6 && secs(arrival - t) < 0.3, "ideal: bytes plus one latency");
        // Sending as fast as the link lets: every 1 s window within the payload rate plus one
        // message.
        let mut p = Pacer::for_rank(&tcp, 0, None).record();
        let t0 = Instant::now();
        for _ in 0..400 {
            p.reserve_at(100_000, t0);
        }
        let peak = peak_rate(p.log(), 1.0);
        assert!(peak <= rate + 100_000.0, "{peak}");
    }

    #[test]
    fn the_bucket_drains_at_its_rate_and_never_sends_before_free() {
        // 8 Mbit/s = 1e6 bytes/s: 1000 bytes take 1 ms.
        let mut p = Pacer::new(8.0, Duration::ZERO).record();
        let t0 = Instant::now();
        let (s1, e1) = p.reserve_at(1000, t0);
        assert_eq!(s1, t0);
        assert_eq!(e1 - s1, Duration::from_millis(1));
        // Asked for at once: queued behind the first.
        let (s2, e2) = p.reserve_at(500, t0);
        assert_eq!(s2, e1);
        assert_eq!(e2 - s2, Duration::from_micros(500));
        assert!(!p.idle_at(t0) && p.idle_at(e2));
        // After an idle gap the link starts at the request time, not at free_at.
        let later = e2 + Duration::from_millis(10);
        let (s3, _) = p.reserve_at(10, later);
        assert_eq!(s3, later);
        assert_eq!(p.log().len(), 3);
    }

    #[test]
    fn a_rewound_link_is_free_where_the_first_taken_back_reservation_began() {
        // 8 Mbit/s: 1000 bytes take 1 ms. Three reservations back to back; the last two taken
        // back; the next one starts where the second began, and the log keeps the first.
        let mut p = Pacer::new(8.0, Duration::ZERO).record();
        let t0 = Instant::now() + Duration::from_secs(1);
        let (_, e1) = p.reserve_at(1000, t0);
        let (s2, _) = p.reserve_at(1000, t0);
        p.reserve_at(1000, t0);
        p.rewind(s2, 2);
        assert_eq!(p.log().len(), 1);
        let (s, e) = p.reserve_at(500, t0);
        assert_eq!((s, e - s), (e1, Duration::from_micros(500)));
        assert_eq!(p.log().len(), 2);
    }

    #[test]
    fn the_token_bucket_earns_at_its_rate_up_to_its_capacity_and_repays_overdraws() {
        // 8 Mbit/s = 1e6 bytes/s, capacity 5000 bytes.
        let mut b = TokenBucket::new(8.0, 5000).record();
        let t0 = b.at;
        assert_eq!(b.available_at(t0), 5000);
        b.spend_at(4000, t0);
        assert_eq!(b.available_at(t0), 1000);
        // 2 ms earn 2000 bytes.
        assert_eq!(b.available_at(t0 + Duration::from_millis(2)), 3000);
        // Never more than the capacity, however long idle.
        assert_eq!(b.available_at(t0 + Duration::from_secs(10)), 5000);
        // An overdraw leaves nothing until repaid: 5000 + 1000 spent, 1 ms earns the 1000 back.
        let t1 = t0 + Duration::from_secs(10);
        b.spend_at(6000, t1);
        assert_eq!(b.available_at(t1), 0);
        assert_eq!(b.available_at(t1 + Duration::from_micros(500)), 0);
        assert_eq!(b.available_at(t1 + Duration::from_millis(3)), 2000);
        assert_eq!(b.log().len(), 2);
        // Spending everything available as fast as possible stays within rate * T + capacity.
        let mut b = TokenBucket::new(8.0, 5000).record();
        let t0 = b.at;
        for i in 0..20_000u32 {
            let now = t0 + Duration::from_micros(100) * i;
            let a = b.available_at(now);
            if a > 0 {
                b.spend_at(a, now);
            }
        }
        let peak = peak_rate(b.log(), 1.0);
        assert!(peak <= 1e6 + 5000.0 + 1.0, "{peak}");
        assert!(peak >= 1e6 - 1000.0, "{peak}");
    }

    #[test]
    fn peak_rate_is_the_fullest_window() {
        let log = [(0.0, 100), (0.5, 100), (0.99, 100), (1.5, 50), (3.0, 1)];
        assert_eq!(peak_rate(&log, 1.0), 300.0);
        assert_eq!(peak_rate(&log, 0.2), 500.0);
        assert_eq!(peak_rate(&[], 1.0), 0.0);
        // A paced log never exceeds rate + one message per window.
        let mut p = Pacer::new(8.0, Duration::ZERO).record();
        let t0 = Instant::now();
        for _ in 0..5000 {
            p.reserve_at(1000, t0);
        }
        let peak = peak_rate(p.log(), 1.0);
        assert!(peak <= 1e6 + 1000.0, "{peak}");
        assert!(peak >= 1e6 - 1000.0, "{peak}");
    }

    /// The closed form of slow start from a window of `w0` bytes on a path of `rate` and
    /// `rtt`, never reaching the path's bandwidth-delay product: k full round trips carry
    /// w0 (2^k - 1) bytes, the smallest k with w0 (2^(k+1) - 1) >= bytes, then the rest at
    /// the rate.
    fn doubling_series_seconds(bytes: f64, w0: f64, rate: f64, rtt: f64) -> f64 {
        let k = (bytes / w0 + 1.0).log2().ceil() - 1.0;
        k * rtt + (bytes - w0 * (2f64.powf(k) - 1.0)) / rate
    }

    #[test]
    fn slow_start_doubles_the_window_each_round_trip_up_to_the_paths_product() {
        let iw = TCP_INITIAL_WINDOW_SEGMENTS * TCP_MSS;
        // A path whose product is never reached (1 GB/s, 100 ms): 1 MB from a new window.
        let mut w = TcpWindow::new();
        let took = w.send(0.0, 1_000_000, 1e9, 0.1);
        let want = doubling_series_seconds(1e6, iw, 1e9, 0.1);
        assert!((took - want).abs() < 1e-9, "{took} against {want}");
        // 1e6 / 14480 = 69.1 windows: rounds of 1, 2, 4, 8, 16, 32 carry 63, the 7th the rest.
        assert!((want - (0.6 + (1e6 - 63.0 * iw) / 1e9)).abs() < 1e-12);
        // The window grew by every byte sent: 14480 + 1e6.
        assert!((w.cwnd() - (iw + 1e6)).abs() < 1e-6);
        // netlab's WAN at scale 1/8: 12.5 Mbit/s of line (payload 1448/1514 of it), 400 ms
        // one way. 2 MiB on a new connection: the window fills the product (1.195 MB) after
        // m = ceil(log2(BDP / IW)) = 7 round trips, carrying IW (2^7 - 1); the rest at the
        // rate. Measured through the relay (`netlab/wan.sh bulk 0 4 2`): 2.76 Mbit/s.
        let rate = 12.5e6 / 8.0 * TCP_PAYLOAD_SHARE;
        let (rtt, bytes) = (0.8, 2.0 * 1048576.0);
        let m = (rate * rtt / iw).log2().ceil();
        assert_eq!(m, 7.0);
        let want = m * rtt + (bytes - iw * (2f64.powf(m) - 1.0)) / rate;
        let mut w = TcpWindow::new();
        let took = w.send(0.0, bytes as u64, rate, rtt);
        assert!((took - want).abs() < 1e-9, "{took} against {want}");
        let mbps = bytes * 8.0 / (took + rtt / 2.0) / 1e6;
        assert!((mbps - 2.72).abs() < 0.01, "{mbps} Mbit/s with the last byte's crossing");
        assert_eq!(w.cwnd(), rate * rtt, "full: the product");
        // Busy (idle under an RTO = RTT + 200 ms): the full window goes on at the rate.
        let t = took + 0.99;
        assert!((w.send(t, 1_000_000, rate, rtt) - 1e6 / rate).abs() < 1e-9);
        // No round trip, no slow start: the ideal pipe's time.
        assert_eq!(TcpWindow::new().send(0.0, 5_000_000, 1e6, 0.0), 5.0);
    }

    #[test]
    fn an_idle_path_halves_its_window_each_rto_down_to_the_initial_one() {
        let iw = TCP_INITIAL_WINDOW_SEGMENTS * TCP_MSS;
        let rate = 12.5e6 / 8.0 * TCP_PAYLOAD_SHARE;
        let rtt = 0.8;
        let bdp = rate * rtt;
        let full = || {
            let mut w = TcpWindow::new();
            let took = w.send(0.0, 20_000_000, rate, rtt);
            assert_eq!(w.cwnd(), bdp);
            (w, took)
        };
        // 3.1 s idle (k 16 steps of 193.8 ms) with an RTO of 1.0 s: Linux's loop subtracts the
        // RTO 3 times while the rest stays positive (2.1, 1.1, 0.1): three halvings, in whole
        // segments: floor(BDP / MSS / 8) segments.
        let (mut w, took) = full();
        w.restart(took + 3.1, rtt);
        assert_eq!(w.cwnd(), (bdp / TCP_MSS / 8.0).floor() * TCP_MSS);
        // An idle of 0.99 s is under the RTO: the window stays.
        let (mut w, took) = full();
        w.restart(took + 0.99, rtt);
        assert_eq!(w.cwnd(), bdp);
        // 12.4 s (k 64): down to the initial window, never under it; the next 1 MB then costs
        // the doubling series again.
        let (mut w, took) = full();
        let at = took + 12.4;
        let again = w.send(at, 1_000_000, rate, rtt);
        let want = doubling_series_seconds(1e6, iw, rate, rtt);
        assert!(iw * 63.0 < bdp, "the series stays under the product here");
        assert!((again - want).abs() < 1e-9, "{again} against {want}");
    }

    #[test]
    fn a_tcp_pacer_keeps_a_window_per_destination_and_rewinds_it() {
        // 8 Mbit/s, 50 ms one way (RTT 100 ms, RTO 300 ms).
        let tcp = Links::on(Fabric::Tcp, &[8.0, 8.0, 8.0], &[50.0, 50.0, 50.0]);
        let rate = tcp.bytes_per_second[0];
        let iw = TCP_INITIAL_WINDOW_SEGMENTS * TCP_MSS;
        let secs = |d: Duration| d.as_secs_f64();
        let mut p = Pacer::for_rank(&tcp, 0, None);
        // Reservations asked for at a time to come, so that none has begun when taken back.
        let t0 = Instant::now() + Duration::from_secs(100);
        // 3 windows (43,440 B) to rank 1: window 1 and 2 take a round trip each (the path
        // holds 6.6 windows), the third leaves at the rate; the window is then 4.
        let (s, e) = p.reserve_to_at(1, 3 * 14_480, t0);
        assert!((secs(e - s) - (0.1 + 2.0 * iw / rate)).abs() < 1e-9);
        // Rank 2's path has its own, new window: the same time again.
        let (s, e) = p.reserve_to_at(2, 3 * 14_480, t0);
        assert!((secs(e - s) - (0.1 + 2.0 * iw / rate)).abs() < 1e-9);
        // Rank 1's path was idle for 0.13 s, under its RTO: 4 windows fit its window of 4.
        let (s, e) = p.reserve_to_at(1, 4 * 14_480, t0);
        assert!((secs(e - s) - 4.0 * iw / rate).abs() < 1e-9);
        // Taken back, the window is restored: the same message costs the same again (had the
        // window stayed grown, to the product, it would cost the same: send 5 windows instead).
        p.rewind(s, 1);
        let (s2, e2) = p.reserve_to_at(1, 4 * 14_480, t0);
        assert_eq!((s2, e2), (s, e));
        p.rewind(s, 1);
        let (_, e3) = p.reserve_to_at(1, 5 * 14_480, t0);
        assert!((secs(e3 - s) - (0.1 + iw / rate)).abs() < 1e-9, "4 windows in one round trip, the 5th behind");
        // The ideal fabric has no window.
        let mut q = Pacer::for_rank(&Links::on(Fabric::Ideal, &[8.0, 8.0], &[50.0, 50.0]), 0, None);
        let (s, e) = q.reserve_to(1, 3 * 14_480);
        assert!((secs(e - s) - 3.0 * 14_480.0 / 1e6).abs() < 1e-9);
    }

    #[test]
    fn the_two_way_share_runs_between_its_two_measured_latencies() {
        let ms = |x: f64| Duration::from_secs_f64(x / 1e3);
        assert_eq!(tcp_two_way_share(ms(1.0)), TCP_TWO_WAY_SHARE_1MS);
        assert!((tcp_two_way_share(ms(10.0)) - TCP_TWO_WAY_SHARE_10MS).abs() < 1e-12);
        assert!((tcp_two_way_share(ms(5.5)) - (0.88 + 0.76) / 2.0).abs() < 1e-12);
        // Outside the measured latencies, the nearer one's share.
        assert_eq!(tcp_two_way_share(ms(0.0)), TCP_TWO_WAY_SHARE_1MS);
        assert_eq!(tcp_two_way_share(ms(400.0)), TCP_TWO_WAY_SHARE_10MS);
        assert_eq!(Fabric::Ideal.two_way_share(ms(10.0)), 1.0);
    }

    #[test]
    fn a_message_that_comes_in_while_the_receiver_sends_arrives_later_on_tcp() {
        let secs = |d: Duration| d.as_secs_f64();
        let tcp = Links::on(Fabric::Tcp, &[8.0, 8.0], &[10.0, 10.0]);
        let rate = tcp.bytes_per_second[1];
        let t0 = Instant::now();
        let mut own = Pacer::for_rank(&tcp, 1, None);
        // Two reservations whose times overlap (one path alone after the other's start) count
        // once: 0.2-0.5 s and 0.3-0.6 s are 0.4 s of sending.
        own.note(t0 + Duration::from_millis(200), t0 + Duration::from_millis(500), 1);
        own.note(t0 + Duration::from_millis(300), t0 + Duration::from_millis(600), 1);
        assert_eq!(own.sending_within(t0, t0 + Duration::from_secs(1)), Duration::from_millis(400));
        assert_eq!(own.sending_within(t0 + Duration::from_millis(550), t0 + Duration::from_secs(1)), Duration::from_millis(50));
        // A message of 0.5 s of bytes arriving at 1.2 s came in over 0.7-1.2 s: the receiver did
        // not send then, so it arrives when it would have.
        let bytes = (0.5 * rate) as u64;
        let mut ingress = Ingress::new(rate);
        let at = t0 + Duration::from_millis(1200);
        let got = ingress.deliver_beside(at, bytes, Some(&own), 0);
        assert!(secs(got - at).abs() < 1e-6);
        // One arriving at 0.6 s came in over 0.1-0.6 s, 0.4 s of them while the receiver sent:
        // those 0.4 s of bytes move at the 10 ms share, 0.4 (1 / 0.76 - 1) s later.
        let mut ingress = Ingress::new(rate);
        let at = t0 + Duration::from_millis(600);
        let got = ingress.deliver_beside(at, bytes, Some(&own), 0);
        let want = 0.4 * (1.0 / TCP_TWO_WAY_SHARE_10MS - 1.0);
        assert!((secs(got - at) - want).abs() < 1e-6, "{} against {want}", secs(got - at));
        assert!(ingress.busy_at(at) && !ingress.busy_at(got));
        // It held the inbound link that much longer: a message right behind it (arriving at
        // 0.65 s on a free link, its bytes over 0.6-0.65 s while the receiver did not send)
        // comes in after it, at its own rate.
        let small = (0.05 * rate) as u64;
        let next = ingress.deliver_beside(t0 + Duration::from_millis(650), small, Some(&own), 0);
        assert!((secs(next - got) - 0.05).abs() < 1e-6, "{}", secs(next - got));
        // The ideal pipe, or no pacer: as deliver_at.
        let ideal = Links::on(Fabric::Ideal, &[8.0, 8.0], &[10.0, 10.0]);
        let mut plain = Pacer::for_rank(&ideal, 1, None);
        plain.note(t0, t0 + Duration::from_secs(1), 1);
        let mut ingress = Ingress::new(rate);
        assert!(secs(ingress.deliver_beside(at, bytes, Some(&plain), 0) - at).abs() < 1e-6);
        let mut ingress = Ingress::new(rate);
        assert!(secs(ingress.deliver_beside(at, bytes, None, 0) - at).abs() < 1e-6);
    }
}
