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

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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
/// asap --transport rma rows of 2026-11-29 at load 9-10 (100 Mbit/s, one put a round, extra =
/// real minus ideal-model seconds over 40 or 20 rounds): MLR at 1 ms one way 94.8 ms a round,
/// at 10 ms 189 ms, so 84.3 ms + 10.5 latencies; MLP 3.3 MB at 1 ms 409 ms, of which 95 is the
/// fixed part and 314 the bytes beyond the payload rate's 277 ms: a share of 277 / 591 = 0.47.
/// The 10 ms bandwidth-bound row is the check outside the fit. The quiet machine's round at
/// 10 ms (benches/asap-transport.sh: 171.8 ms, 139 over the ideal's) is 26 % under the fit:
/// this transport's cost moves with the load.
pub const TCP_ONE_SIDED_EXTRA_MS: f64 = 84.3;

/// See [`TCP_ONE_SIDED_EXTRA_MS`].
pub const TCP_ONE_SIDED_EXTRA_LATENCIES: f64 = 10.5;

/// See [`TCP_ONE_SIDED_EXTRA_MS`].
pub const TCP_ONE_SIDED_RATE_SHARE: f64 = 0.47;

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
/// the same speed both ways), one-way latency, and the fabric that carries them.
#[derive(Clone, Debug, PartialEq)]
pub struct Links {
    pub bytes_per_second: Vec<f64>,
    pub latency: Vec<Duration>,
    pub fabric: Fabric,
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
        }
    }
    /// The slowest rate of all ranks (what paces a ring or tree collective: every step waits for
    /// its slowest link) and the largest latency.
    pub fn slowest(&self) -> (f64, Duration) {
        let r = self.bytes_per_second.iter().copied().fold(f64::INFINITY, f64::min);
        let l = self.latency.iter().copied().max().unwrap_or_default();
        (r, l)
    }
    /// The rate of the path from `from` to `to`: the slower of the sender's egress and the
    /// receiver's ingress.
    pub fn path_rate(&self, from: usize, to: usize) -> f64 {
        self.bytes_per_second[from].min(self.bytes_per_second[to])
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
}

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
        }
    }

    /// This rank's link within `links`: its own rate and latency, and a message to rank `d` is
    /// carried at the slower of the two ends (a 1 GbE sender to a 100 Mbit/s receiver sends at
    /// 100 Mbit/s). `budget_mbps` caps this rank's rate further (a mode's own budget).
    pub fn for_rank(links: &Links, rank: usize, budget_mbps: Option<f64>) -> Self {
        let cap = budget_mbps.map_or(f64::INFINITY, |b| b * 1e6 / 8.0);
        let own = links.bytes_per_second[rank].min(cap);
        let now = Instant::now();
        let n = links.bytes_per_second.len();
        let paths = (0..n).map(|d| links.path_rate(rank, d).min(cap)).collect();
        let lat = (0..n).map(|d| links.latency[rank].max(links.latency[d])).collect();
        Pacer {
            bytes_per_second: own,
            latency: links.latency[rank],
            path_rates: Some(paths),
            path_latency: Some(lat),
            fabric: links.fabric,
            free_at: now,
            start: now,
            log: None,
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
    /// message the fabric holds up (a TCP rendezvous) holds the link that much longer.
    pub fn reserve_at(&mut self, bytes: u64, now: Instant) -> (Instant, Instant) {
        self.reserve_at_rate(bytes, now, self.bytes_per_second, self.latency)
    }

    /// [`Pacer::reserve_at`] at `rate` bytes per second (a path slower than this rank's link)
    /// over a path of one-way `latency`.
    fn reserve_at_rate(&mut self, bytes: u64, now: Instant, rate: f64, latency: Duration) -> (Instant, Instant) {
        let start = self.free_at.max(now);
        let end = start + Duration::from_secs_f64(bytes as f64 / rate) + self.fabric.rendezvous(bytes, rate, latency);
        self.free_at = end;
        if let Some(log) = &mut self.log {
            log.push(((start - self.start).as_secs_f64(), bytes));
        }
        (start, end)
    }

    /// [`Pacer::reserve_at`] now.
    pub fn reserve(&mut self, bytes: u64) -> (Instant, Instant) {
        self.reserve_at(bytes, Instant::now())
    }

    /// [`Pacer::reserve`] for a message to rank `dest`, at the rate of the path there.
    pub fn reserve_to(&mut self, dest: usize, bytes: u64) -> (Instant, Instant) {
        let rate = self.path_rates.as_ref().and_then(|p| p.get(dest).copied()).unwrap_or(self.bytes_per_second);
        self.reserve_at_rate(bytes, Instant::now(), rate, self.latency_to(dest))
    }

    /// A one-sided put of `bytes` to rank `dest`: when the link has delivered it, its last
    /// byte out plus the path's latency and what the fabric adds to a put
    /// ([`Fabric::one_sided_extra`]; no rendezvous: one-sided puts have none).
    pub fn put_to(&mut self, dest: usize, bytes: u64) -> Instant {
        let rate = self.path_rates.as_ref().and_then(|p| p.get(dest).copied()).unwrap_or(self.bytes_per_second);
        let latency = self.latency_to(dest);
        let start = self.free_at.max(Instant::now());
        let end = start + Duration::from_secs_f64(bytes as f64 / self.fabric.one_sided_rate(rate));
        self.free_at = end;
        if let Some(log) = &mut self.log {
            log.push(((start - self.start).as_secs_f64(), bytes));
        }
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
    pub fn rewind(&mut self, to: Instant, reservations: usize) {
        self.free_at = to;
        if let Some(log) = &mut self.log {
            log.truncate(log.len().saturating_sub(reservations));
        }
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
        let took = Duration::from_secs_f64(bytes as f64 / self.bytes_per_second);
        // `arrival - took` is when it would have started coming in; `Instant` cannot go before
        // the process's first instant, so clamp at the link's own start.
        let wanted = arrival.checked_sub(took).unwrap_or(self.start).max(self.start);
        let start = wanted.max(self.free_at);
        let end = start + took;
        self.free_at = end;
        if let Some(log) = &mut self.log {
            log.push(((start - self.start).as_secs_f64(), bytes));
        }
        end.max(arrival)
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
        let mut p = Pacer::for_rank(&tcp, 0, None).record();
        // Up to the eager limit: the bytes over the payload rate, no wait.
        let (s, e) = p.reserve_to(1, TCP_EAGER_BYTES);
        assert!((secs(e - s) - TCP_EAGER_BYTES as f64 / rate).abs() < 1e-6);
        // Beyond it: plus a round trip (100 ms) less the eager part's own time on the link (a
        // 4 MiB eager part takes 4.4 s at this rate: a round trip of 5 s to see the wait).
        let mut p = Pacer::for_rank(&Links::on(Fabric::Tcp, &[8.0, 8.0], &[2500.0, 2500.0]), 0, None).record();
        let (_, e) = p.reserve_to(1, TCP_EAGER_BYTES);
        let big = TCP_EAGER_BYTES + 200_000;
        let (s2, e2) = p.reserve_to(1, big);
        assert_eq!(s2, e, "one egress queue");
        let want = big as f64 / rate + (5.0 - TCP_EAGER_BYTES as f64 / rate);
        assert!((secs(e2 - s2) - want).abs() < 1e-6, "{} against {want}", secs(e2 - s2));
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
}
