//! Step-time variance for the emulated cluster (`--emulate-jitter`): each declared step's time is
//! multiplied by a factor drawn from a distribution given by its quantiles, `P:FACTOR` pairs from
//! P = 0 (the fastest step) to P = 1 (the slowest), e.g. `0:0.97,0.5:1,0.9:1.06,0.99:1.5,1:3`.
//! Between the given points the quantile function is linear, so a draw is the factor at a uniform
//! P. `asap-train bench` measures the pairs from real steps on the machine it runs on (each step
//! against the mean step, the time a profile declares) and `--write-profile` stores them in a cluster profile's `[jitter]`
//! table, beside the step time they vary.
//!
//! Every rank draws from its own seeded stream (the run's `--seed` and the rank), apart from the
//! training's streams: the same run draws the same factors, and turning jitter on changes no
//! example order.

use crate::rng::Rng;

/// A step-time distribution by its quantiles: `(P, FACTOR)` with P rising from 0 to 1 and the
/// factors not falling. Written back as the text it was parsed from.
#[derive(Clone, Debug, PartialEq)]
pub struct Jitter {
    points: Vec<(f64, f64)>,
    text: String,
}

impl std::str::FromStr for Jitter {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let help = "give P:FACTOR pairs from P = 0 to P = 1, e.g. 0:0.97,0.5:1,0.9:1.06,0.99:1.5,1:3 (asap-train bench measures them)";
        let mut points = Vec::new();
        for part in s.split(',') {
            let (p, f) = part.split_once(':').ok_or_else(|| format!("{part:?} is not P:FACTOR; {help}"))?;
            let p: f64 = p.trim().parse().map_err(|_| format!("{part:?}: the quantile {p:?} is not a number; {help}"))?;
            let f: f64 = f.trim().parse().map_err(|_| format!("{part:?}: the factor {f:?} is not a number; {help}"))?;
            if !(0.0..=1.0).contains(&p) {
                return Err(format!("{part:?}: the quantile must be between 0 and 1; {help}"));
            }
            if !(f.is_finite() && f > 0.0 && f <= 1e3) {
                return Err(format!("{part:?}: the factor must be a positive number, at most 1000; {help}"));
            }
            if let Some(&(lp, lf)) = points.last() {
                if p <= lp || f < lf {
                    return Err(format!("{part:?}: the quantiles must rise and the factors must not fall; {help}"));
                }
            }
            points.push((p, f));
        }
        if points.first().map(|p| p.0) != Some(0.0) || points.last().map(|p| p.0) != Some(1.0) {
            return Err(format!("{s:?} must start at P = 0 and end at P = 1; {help}"));
        }
        Ok(Jitter { points, text: s.to_string() })
    }
}

impl std::fmt::Display for Jitter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl serde::Serialize for Jitter {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

impl<'de> serde::Deserialize<'de> for Jitter {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

impl Jitter {
    /// The factor at quantile `u` (0 to 1): linear between the given points.
    pub fn quantile(&self, u: f64) -> f64 {
        let i = self.points.partition_point(|&(p, _)| p < u).clamp(1, self.points.len() - 1);
        let ((p0, f0), (p1, f1)) = (self.points[i - 1], self.points[i]);
        f0 + (f1 - f0) * ((u - p0) / (p1 - p0)).clamp(0.0, 1.0)
    }

    /// The mean factor (the integral of the quantile function): a step lasts this many declared
    /// times on average.
    pub fn mean(&self) -> f64 {
        self.points.windows(2).map(|w| (w[1].0 - w[0].0) * (w[0].1 + w[1].1) / 2.0).sum()
    }

    /// The given points strictly inside (0, 1): what a run's sampled quantiles are checked at.
    pub fn inner_points(&self) -> impl Iterator<Item = (f64, f64)> + '_ {
        self.points.iter().copied().filter(|&(p, _)| p > 0.0 && p < 1.0)
    }

    /// The quantile pairs of `samples` (each against their mean) at `probabilities`, in this
    /// type's text form: what `asap-train bench` measures and a profile stores. Against the mean,
    /// because the step time a profile declares is the mean step: the factors then average to
    /// about 1, and a jittered run keeps the measured pace.
    pub fn measured(samples: &[f64], probabilities: &[f64]) -> Option<Jitter> {
        let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite() && *x > 0.0).collect();
        if v.len() < 2 {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let mut text = Vec::new();
        let mut last = 0.0;
        for &p in probabilities {
            // Rounded to 3 decimals, never below the last (the form must not fall).
            let f = ((sample_quantile(&v, p) / mean * 1e3).round() / 1e3).max(last).max(1e-3);
            text.push(format!("{p}:{f}"));
            last = f;
        }
        text.join(",").parse().ok()
    }
}

/// The quantile at `p` of sorted `v` (linear between order statistics).
pub fn sample_quantile(v: &[f64], p: f64) -> f64 {
    let x = p.clamp(0.0, 1.0) * (v.len() - 1) as f64;
    let (i, frac) = (x.floor() as usize, x.fract());
    if i + 1 < v.len() {
        v[i] + (v[i + 1] - v[i]) * frac
    } else {
        v[v.len() - 1]
    }
}

/// One rank's draws: the distribution, its stream, and the factors drawn so far (for the
/// run's check of its own quantiles).
pub struct JitterDraws {
    jitter: Jitter,
    rng: Rng,
    drawn: Vec<f32>,
}

/// The stream id of the jitter draws (apart from the training's streams).
const STREAM: u64 = 0x6a17_7e72;

impl JitterDraws {
    pub fn new(jitter: Jitter, seed: u64, rank: usize) -> Self {
        JitterDraws { jitter, rng: Rng::for_stream(seed ^ STREAM, rank as u64), drawn: Vec::new() }
    }

    /// The next step's factor.
    pub fn draw(&mut self) -> f64 {
        let f = self.jitter.quantile(self.rng.next_f64());
        self.drawn.push(f as f32);
        f
    }

    /// The mean factor drawn (1 before any draw).
    pub fn mean_drawn(&self) -> f64 {
        if self.drawn.is_empty() {
            return 1.0;
        }
        self.drawn.iter().map(|&f| f as f64).sum::<f64>() / self.drawn.len() as f64
    }

    /// How far the factors drawn are from the distribution: the largest difference, over the
    /// given inner points (P, FACTOR), between P and the fraction of draws at most FACTOR (0
    /// before any draw). Measured in probability, not in factor: next to a steep part of the
    /// quantile function (a long tail) a sample quantile jumps by the slope times its noise.
    pub fn quantile_error(&self) -> f64 {
        if self.drawn.is_empty() {
            return 0.0;
        }
        let n = self.drawn.len() as f64;
        // Compared in f32, as the draws are kept: a point mass (`0:0.684,0.75:0.684,...`) draws
        // exactly its factor, whose f32 lies above the f64 (0.684 becomes 0.68400002), so an f64
        // comparison counted none of the 75 % drawn there (a 0.75 error in the first run of the
        // ASYNC paper's production form).
        let below = |f: f64| self.drawn.iter().filter(|&&x| x <= f as f32).count() as f64 / n;
        self.jitter.inner_points().map(|(p, f)| (below(f) - p).abs()).fold(0.0, f64::max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_checks_and_writes_back_the_form() {
        let j: Jitter = "0:0.97,0.5:1,0.9:1.06,0.99:1.5,1:3".parse().unwrap();
        assert_eq!(j.to_string(), "0:0.97,0.5:1,0.9:1.06,0.99:1.5,1:3");
        for bad in ["0.5:1", "0:1,0.5:1", "0:1,1:0.5", "0:1,0.5:x,1:2", "0:1;1:2", "0:1,1.5:2", "0:0,1:1", "0:1,0.5:2,0.4:3,1:4"] {
            let e = bad.parse::<Jitter>().unwrap_err();
            assert!(e.contains("P:FACTOR") || e.contains("e.g."), "{bad}: {e}");
        }
    }

    #[test]
    fn quantile_function_is_linear_between_points_and_its_mean_is_its_integral() {
        let j: Jitter = "0:1,0.5:1,0.9:2,1:4".parse().unwrap();
        assert_eq!(j.quantile(0.0), 1.0);
        assert_eq!(j.quantile(0.5), 1.0);
        assert!((j.quantile(0.7) - 1.5).abs() < 1e-12);
        assert_eq!(j.quantile(1.0), 4.0);
        // 0.5 x 1 + 0.4 x 1.5 + 0.1 x 3
        assert!((j.mean() - 1.4).abs() < 1e-12, "{}", j.mean());
    }

    /// The test: 100,000 seeded draws have the declared quantiles: at each given point,
    /// the fraction of draws at most its factor is its P (deterministic: the stream is seeded;
    /// the bound is 6 standard errors of such a fraction at this count, sqrt(0.25 / 1e5)).
    #[test]
    fn sampled_quantiles_match_the_declared_ones() {
        let j: Jitter = "0:0.9,0.1:0.95,0.5:1,0.9:1.2,0.99:2,1:5".parse().unwrap();
        let mut d = JitterDraws::new(j.clone(), 7, 3);
        (0..100_000).for_each(|_| {
            d.draw();
        });
        assert!(d.quantile_error() < 0.01, "{}", d.quantile_error());
        assert!((d.mean_drawn() / j.mean() - 1.0).abs() < 0.01, "{} against {}", d.mean_drawn(), j.mean());
        assert!(d.drawn.iter().all(|&f| (0.9..=5.0).contains(&f)));
        // A different rank draws a different stream; the same rank the same one.
        let mut again = JitterDraws::new(j.clone(), 7, 3);
        let mut other = JitterDraws::new(j, 7, 4);
        let (a, b): (Vec<f64>, Vec<f64>) = (0..5).map(|_| (again.draw(), other.draw())).unzip();
        assert_eq!(a.iter().map(|&f| f as f32).collect::<Vec<_>>(), d.drawn[..5]);
        assert_ne!(a, b);
    }

    /// A form with a point mass (three steps in four at exactly the lowest factor) and a jump
    /// after it checks out as well as a smooth one.
    #[test]
    fn a_point_mass_checks_out() {
        let j: Jitter = "0:0.684,0.75:0.684,0.7501:1.026,0.95:1.709,1:6.838".parse().unwrap();
        let mut d = JitterDraws::new(j, 1, 0);
        (0..100_000).for_each(|_| {
            d.draw();
        });
        assert!(d.quantile_error() < 0.01, "{}", d.quantile_error());
    }

    #[test]
    fn measured_quantiles_are_against_the_mean() {
        // 1..=101: mean 51, and the quantile function through 0, 0.5 and 1 has mean 1 too.
        let samples: Vec<f64> = (1..=101).map(|i| i as f64).collect();
        let j = Jitter::measured(&samples, &[0.0, 0.5, 1.0]).unwrap();
        let r = |x: f64| (x / 51.0 * 1e3).round() / 1e3;
        assert_eq!(j.to_string(), format!("0:{},0.5:1,1:{}", r(1.0), r(101.0)));
        assert!((j.mean() - 1.0).abs() < 1e-3, "{}", j.mean());
        assert!(Jitter::measured(&[1.0], &[0.0, 1.0]).is_none());
    }
}
