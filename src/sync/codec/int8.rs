//! Eight bits a value on the wire, with a scale per block (issue 40, "compressed exchange with
//! error feedback"; the int8 of 1-bit Adam's and Tang et al. 2021's compressed allreduce): each
//! block of `block` values is one little-endian f32 scale, max |x| / 127, then one i8 a value,
//! the nearest multiple of the scale (a block of zeros has scale 0). The decoded value is
//! `q as f32 * scale`.
//!
//! - **Bytes**: `n + 4 * ceil(n / block)`. [`DEFAULT_BLOCK`] is 256: 4n / (n + 4n/256) = 3.94x
//!   fewer bytes than single precision, against 3.76x at 64 and 3.98x at 1,024. The scale follows
//!   the block's largest value, so a smaller block tracks parts of a model of different scales
//!   better; for normal values the largest of a block grows only as sqrt(2 ln block) (measured
//!   by `a_smaller_block_costs_bytes_a_larger_one_precision`: rms error / rms value 0.59 % at 64,
//!   0.70 % at 256, 0.79 % at 1,024). From 64 to 256 the bytes fall 4.5 % for 19 % more error;
//!   from 256 to 1,024 only 1.2 % more for 13 % more error, which no longer pays.
//! - **Error feedback is exact**: with a residual, `x = values + residual` (one f32 addition) is
//!   encoded and `residual = x - d` is left, d the decoded value, and that subtraction is exact,
//!   so `x == d + residual` in real numbers, for every finite input. Why: the level is
//!   q = round(fl(x / s)) and d = fl(q s), s = fl(max / 127) the block's scale. For q = 0,
//!   d = 0. Otherwise x and d have one sign and d/2 <= x <= 2d, so x - d is an f32 by
//!   Sterbenz's lemma (which holds with subnormals too). With u = 2^-24 and s normal: at
//!   q = 1, d = s exactly, and fl(x / s) >= 0.5 needs x / s > 0.5 - 2^-25 (0.5 - 2^-25 is the
//!   f32 below 0.5), while an f32 under s/2 is at most s/2 (1 - u): so x >= s/2 = d/2. For
//!   q >= 2, x >= (q - 1/2)(1 - u) s and d <= q s (1 + u) <= 2x. And d >= q s (1 - u) >=
//!   x / 2, as x <= (q + 1/2)(1 + u) s. No value exceeds 127.5 scales (s >= max / 127 (1 -
//!   u)), so the saturation at 127 never cuts one.
//!   With s subnormal and at least 2^-140 the same bounds hold with 2^-10 for the relative
//!   error of s and d; below 2^-140 every x and d is a multiple of 2^-149 under 2^-132, and any
//!   difference of two such is an f32. `int8_keeps_exactness_at_the_edges` sends values at
//!   s/2 and 3s/2 and their neighbours in blocks of all three kinds;
//!   `int8_error_feedback_is_exact_at_every_magnitude` 300,000 random bit patterns.
//! - **Non-finite values are not encoded as numbers**: a block holding NaN or an infinity gets a
//!   NaN scale, so it decodes to NaN on every receiver (and its residual to NaN): a diverged
//!   model stays visibly diverged instead of turning into finite garbage, and the caller refuses
//!   the result (`CompressedMean` does, on every rank alike, in mean.rs).

use super::ValueCodec;

/// The default values per scale (the bytes and the precision it costs: see the file's doc).
pub const DEFAULT_BLOCK: usize = 256;

/// Values as i8 levels of a per-block f32 scale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Int8 {
    /// Values per scale (at least 1).
    pub block: usize,
}

/// The value level `q` of scale `scale` stands for. The encoder's residual and every decoder go
/// through this one function, so they agree bit for bit.
fn dequantise(q: i8, scale: f32) -> f32 {
    f32::from(q) * scale
}

/// The block's scale: max |x| / 127, 0 for a block of zeros, NaN when a value is not finite.
fn scale_of(block: &[f32]) -> f32 {
    let max = block.iter().fold(0f32, |m, &x| if x.abs() > m || x.is_nan() { x.abs() } else { m });
    if max.is_finite() {
        max / 127.0
    } else {
        f32::NAN
    }
}

/// The level of `x` under `scale`: the nearest (0 under a zero, NaN or underflowed scale). The
/// cast saturates at +-127, which no value of the block reaches past (see the file's doc).
fn level(x: f32, scale: f32) -> i8 {
    if scale > 0.0 {
        (x / scale).round() as i8
    } else {
        0
    }
}

/// Appends one block (its scale, then its levels) and returns the scale.
fn encode_block(block: &[f32], out: &mut Vec<u8>) -> f32 {
    let scale = scale_of(block);
    out.extend_from_slice(&scale.to_le_bytes());
    out.extend(block.iter().map(|&x| level(x, scale) as u8));
    scale
}

impl ValueCodec for Int8 {
    fn encoded_len(&self, n: usize) -> usize {
        n + 4 * n.div_ceil(self.block)
    }

    fn encode(&self, values: &[f32], residual: Option<&mut [f32]>, out: &mut Vec<u8>) {
        match residual {
            None => values.chunks(self.block).for_each(|b| {
                encode_block(b, out);
            }),
            Some(res) => {
                debug_assert_eq!(res.len(), values.len());
                for (vb, rb) in values.chunks(self.block).zip(res.chunks_mut(self.block)) {
                    // The residual becomes the input x = values + residual, is encoded, and is
                    // left with x - decoded (exact: see the file's doc).
                    rb.iter_mut().zip(vb).for_each(|(r, &v)| *r += v);
                    let at = out.len() + 4;
                    let scale = encode_block(rb, out);
                    rb.iter_mut().zip(&out[at..]).for_each(|(r, &q)| *r -= dequantise(q as i8, scale));
                }
            }
        }
    }

    fn decode(&self, bytes: &[u8], n: usize, into: &mut Vec<f32>) -> anyhow::Result<()> {
        super::ensure_len(bytes, self.encoded_len(n), "int8", n)?;
        for b in bytes.chunks(4 + self.block) {
            let scale = f32::from_le_bytes(b[..4].try_into().expect("4 bytes"));
            into.extend(b[4..].iter().map(|&q| dequantise(q as i8, scale)));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// Values of every magnitude from 1e-6 to 1e2, some exactly zero, some blocks all zero.
    fn mixed(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = Rng::new(seed);
        (0..n)
            .map(|i| if i % 13 == 0 || (300..600).contains(&i) { 0.0 } else { (rng.normal() * 10f64.powi(i as i32 % 9 - 6)) as f32 })
            .collect()
    }

    /// Without a residual: `encoded_len` bytes, each value within half a scale of its input, the
    /// block's largest value exactly +-127 levels, zero blocks zero, and the byte layout as
    /// documented (scale, then levels).
    #[test]
    fn int8_round_trips_within_half_a_scale() {
        for block in [1, 7, 256] {
            let codec = Int8 { block };
            for n in [0, 1, 6, 7, 8, 700] {
                let values = mixed(n, 3 + n as u64);
                let mut out = vec![9u8];
                codec.encode(&values, None, &mut out);
                assert_eq!(out.len() - 1, codec.encoded_len(n), "block {block}, {n} values");
                assert_eq!(codec.encoded_len(n), n + 4 * n.div_ceil(block));
                let mut back = Vec::new();
                codec.decode(&out[1..], n, &mut back).unwrap();
                assert_eq!(back.len(), n);
                for (b, (vs, ds)) in values.chunks(block).zip(back.chunks(block)).enumerate() {
                    let max = vs.iter().fold(0f32, |m, x| m.max(x.abs()));
                    let scale = max / 127.0;
                    assert_eq!(&out[1 + b * (4 + block)..][..4], scale.to_le_bytes(), "block {b}'s scale");
                    for (&v, &d) in vs.iter().zip(ds) {
                        assert!((v - d).abs() <= scale * 0.5001, "{v} -> {d} at scale {scale}");
                        if v.abs() == max {
                            assert_eq!(d.abs(), 127.0 * scale);
                        }
                    }
                    if max == 0.0 {
                        assert!(ds.iter().all(|&d| d == 0.0));
                    }
                }
                if n > 0 {
                    assert!(codec.decode(&out[2..], n, &mut Vec::new()).is_err(), "a byte short");
                }
            }
        }
        // Levels round to the nearest: 1.0 at scale 127/127 is level 1, 0.49 is 0, -0.51 is -1.
        let mut out = Vec::new();
        Int8 { block: 4 }.encode(&[127.0, 1.0, 0.49, -0.51], None, &mut out);
        assert_eq!(out, [1f32.to_le_bytes().as_slice(), &[127, 1, 0, (-1i8) as u8]].concat());
    }

    /// With a residual, send after send: values + residual before == decoded + residual after,
    /// exactly in real numbers (checked in f64, where the sum of two f32 is exact), and the
    /// residual never exceeds half a scale (1/254 of the block's largest |x|).
    #[test]
    fn int8_error_feedback_loses_nothing() {
        for block in [1, 5, DEFAULT_BLOCK] {
            let codec = Int8 { block };
            let n = 1000;
            let mut residual = vec![0f32; n];
            for send in 0..6 {
                let values = mixed(n, 100 + send);
                let before = residual.clone();
                let mut out = Vec::new();
                codec.encode(&values, Some(&mut residual), &mut out);
                assert_eq!(out.len(), codec.encoded_len(n));
                let mut sent = Vec::new();
                codec.decode(&out, n, &mut sent).unwrap();
                for (b, start) in (0..n).step_by(block).enumerate() {
                    let end = (start + block).min(n);
                    let x: Vec<f32> = (start..end).map(|i| values[i] + before[i]).collect();
                    let max = x.iter().fold(0f32, |m, v| m.max(v.abs()));
                    for (k, i) in (start..end).enumerate() {
                        assert_eq!(sent[i] as f64 + residual[i] as f64, x[k] as f64, "block {b}, value {i}: {} + {}", sent[i], residual[i]);
                        assert!(residual[i].abs() <= max / 254.0 * 1.0001, "value {i}: residual {} of a block up to {max}", residual[i]);
                    }
                }
            }
        }
    }

    /// Values at half a scale and one and a half scales and their neighbours, in blocks of normal
    /// scale, of subnormal scale at least 2^-140 and below it (the cases of the file's proof):
    /// x == decoded + residual exactly, and a value under half a scale is level 0.
    #[test]
    fn int8_keeps_exactness_at_the_edges() {
        let codec = Int8 { block: 2 };
        // The f32s next to x (NaN bit patterns below +0, skipped).
        let next = |x: f32, by: i32| f32::from_bits((x.to_bits() as i32 + by) as u32);
        for top in [127.0 * 1.1f32, 1.0, 3.0e-3, 1.0e-37, 2.0e-39, 1.0e-41, 2.0e-43, 1.4e-45] {
            let scale = top / 127.0;
            for edge in [scale / 2.0, 1.5 * scale, 100.5 * scale] {
                for x in [next(edge, -2), next(edge, -1), edge, next(edge, 1), -next(edge, -1)] {
                    if !x.is_finite() || x.abs() > top {
                        continue;
                    }
                    let mut residual = [0f32; 2];
                    let mut out = Vec::new();
                    codec.encode(&[top, x], Some(&mut residual), &mut out);
                    let mut sent = Vec::new();
                    codec.decode(&out, 2, &mut sent).unwrap();
                    assert_eq!(sent[0] as f64 + residual[0] as f64, top as f64, "{top}");
                    assert_eq!(sent[1] as f64 + residual[1] as f64, x as f64, "{x} beside {top}");
                    if scale.is_normal() && (x.abs() as f64) < scale as f64 / 2.0 {
                        assert_eq!(out[5], 0, "{x} under half of {scale}");
                    }
                }
            }
        }
        let mut out = Vec::new();
        codec.encode(&[0.0, -0.0], None, &mut out);
        assert_eq!(out, [0, 0, 0, 0, 0, 0]);
    }

    /// Random bit patterns (every exponent from subnormal to f32::MAX, blocks of 3 mixing them):
    /// x == decoded + residual exactly for every finite one.
    #[test]
    fn int8_error_feedback_is_exact_at_every_magnitude() {
        let mut rng = Rng::new(12);
        let values: Vec<f32> =
            (0..300_000).map(|_| f32::from_bits((rng.next_f64() * u32::MAX as f64) as u32)).filter(|x| x.is_finite()).collect();
        let mut residual = vec![0f32; values.len()];
        let mut out = Vec::new();
        Int8 { block: 3 }.encode(&values, Some(&mut residual), &mut out);
        let mut sent = Vec::new();
        Int8 { block: 3 }.decode(&out, values.len(), &mut sent).unwrap();
        for i in 0..values.len() {
            assert_eq!(sent[i] as f64 + residual[i] as f64, values[i] as f64, "value {i}: {} = {} + {}", values[i], sent[i], residual[i]);
        }
    }

    /// A block with NaN or an infinity decodes to NaN (the other blocks unharmed).
    #[test]
    fn int8_sends_non_finite_blocks_as_nan() {
        let codec = Int8 { block: 2 };
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            for at in [0, 1] {
                let mut values = vec![1.0f32, -2.0, 3.0, 4.0];
                values[at] = bad;
                let mut residual = vec![0f32; 4];
                let mut out = Vec::new();
                codec.encode(&values, Some(&mut residual), &mut out);
                let mut sent = Vec::new();
                codec.decode(&out, 4, &mut sent).unwrap();
                assert!(sent[..2].iter().all(|d| d.is_nan()), "{bad} at {at}: {sent:?}");
                assert_eq!([sent[2] + residual[2], sent[3] + residual[3]], [3.0, 4.0], "the finite block as ever");
            }
        }
    }

    /// The block size's trade (the file's doc): on normal values, the rms quantisation error
    /// relative to the rms value at 64, 256 and 1,024 values a block, and the bytes.
    #[test]
    fn a_smaller_block_costs_bytes_a_larger_one_precision() {
        let mut rng = Rng::new(7);
        let values: Vec<f32> = (0..1 << 18).map(|_| rng.normal() as f32).collect();
        let rms = |v: &mut dyn Iterator<Item = f64>| {
            let (s, c) = v.fold((0.0, 0usize), |(s, c), x| (s + x * x, c + 1));
            (s / c as f64).sqrt()
        };
        let of = rms(&mut values.iter().map(|&x| x as f64));
        let mut errors = Vec::new();
        for block in [64, 256, 1024] {
            let codec = Int8 { block };
            let mut out = Vec::new();
            codec.encode(&values, None, &mut out);
            let mut back = Vec::new();
            codec.decode(&out, values.len(), &mut back).unwrap();
            let err = rms(&mut values.iter().zip(&back).map(|(&v, &d)| (v - d) as f64)) / of;
            let fewer = (4 * values.len()) as f64 / out.len() as f64;
            errors.push((block, (err * 1e4).round() / 1e2, (fewer * 100.0).round() / 100.0));
        }
        assert_eq!(errors, [(64, 0.59, 3.76), (256, 0.7, 3.94), (1024, 0.79, 3.98)], "(block, error %, x fewer bytes)");
    }
}
