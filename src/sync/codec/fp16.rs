//! Half precision on the wire: every value as the IEEE 754 binary16 nearest to it (ties to even,
//! saturating at 65504), little-endian, 2 bytes a value: half the bytes of single precision.
//! `--compress fp16`: Bösen's pushes (docs/sync-modes.md, "fp16") travel in it inside the row
//! format (rows.rs), the rounding error staying in the sender's buffer for a later push;
//! allreduce's compressed mean (mean.rs) sends its chunks in it with the rounding error in its
//! residuals. Either way nothing is lost.

use super::ValueCodec;

/// Half the smallest binary16 subnormal, 2^-25: anything smaller encodes as zero.
pub const F16_HALF_MIN: f32 = 2.980_232_2e-8;

/// The IEEE 754 binary16 nearest to `x` (ties to even), as bits. Values beyond the largest finite
/// half (65504) saturate to it, so an update is never turned into infinity (the excess stays in
/// the sender's buffer like any rounding error).
pub fn f16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let a = x.abs();
    if a.is_nan() {
        return sign | 0x7e00;
    }
    if a >= 65504.0 {
        return sign | 0x7bff;
    }
    let exp = ((b >> 23) & 0xff) as i32 - 127;
    let mant = b & 0x7f_ffff;
    if exp < -25 {
        // Below half the smallest subnormal (2^-25) everything rounds to zero (exactly 2^-25
        // ties to the even zero below, through the general rounding).
        return sign;
    }
    // The significand with its implicit bit, and how far right it must move to land on a half's
    // grid: normal halves keep 10 fraction bits, subnormals have a fixed exponent of -14.
    let full = mant | 0x80_0000;
    let shift = if exp < -14 { 13 + (-14 - exp) } else { 13 } as u32;
    let kept = full >> shift;
    let rest = full & ((1 << shift) - 1);
    let half = 1 << (shift - 1);
    let rounded = kept + u32::from(rest > half || (rest == half && kept & 1 == 1));
    if exp < -14 {
        // Subnormal (a carry into bit 10 correctly gives the smallest normal).
        sign | rounded as u16
    } else {
        // Normal: a carry out of the fraction bumps the exponent, which the addition does.
        let e = (exp + 15) as u32;
        sign | ((e << 10) + (rounded - 0x400)) as u16
    }
}

/// The value of binary16 bits.
pub fn f16_value(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let e = ((h >> 10) & 0x1f) as i32;
    let f = (h & 0x3ff) as f32;
    sign * match e {
        0 => f * 2f32.powi(-24),
        31 if f == 0.0 => f32::INFINITY,
        31 => f32::NAN,
        _ => (1.0 + f / 1024.0) * 2f32.powi(e - 15),
    }
}

/// Values in binary16 ([`f16_bits`]), 2 bytes each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fp16;

impl ValueCodec for Fp16 {
    fn encoded_len(&self, n: usize) -> usize {
        2 * n
    }

    fn encode(&self, values: &[f32], residual: Option<&mut [f32]>, out: &mut Vec<u8>) {
        match residual {
            None => values.iter().for_each(|&x| out.extend_from_slice(&f16_bits(x).to_le_bytes())),
            Some(res) => {
                debug_assert_eq!(res.len(), values.len());
                for (&x, r) in values.iter().zip(res.iter_mut()) {
                    let h = f16_bits(x + *r);
                    out.extend_from_slice(&h.to_le_bytes());
                    // Exact (Sterbenz) inside binary16's range: the nearest half is within a
                    // factor of 2 of the value, or zero.
                    *r = x + *r - f16_value(h);
                }
            }
        }
    }

    fn decode(&self, bytes: &[u8], n: usize, into: &mut Vec<f32>) -> anyhow::Result<()> {
        super::ensure_len(bytes, self.encoded_len(n), "fp16", n)?;
        into.extend(bytes.chunks_exact(2).map(|c| f16_value(u16::from_le_bytes(c.try_into().expect("2 bytes")))));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    #[test]
    fn f16_rounds_to_nearest_even_and_saturates() {
        // Exact values survive.
        for x in [0.0f32, 1.0, -2.5, 0.099975586, 65504.0, 6.1035156e-5, 5.9604645e-8, -1024.0] {
            assert_eq!(f16_value(f16_bits(x)), x, "{x}");
        }
        assert_eq!(f16_bits(1.0), 0x3c00);
        assert_eq!(f16_bits(-2.0), 0xc000);
        // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1.0).
        assert_eq!(f16_bits(1.0 + 2f32.powi(-11)), 0x3c00);
        // 1 + 3 * 2^-11 is halfway between 1+2^-10 (odd) and 1+2^-9 (even): rounds up.
        assert_eq!(f16_bits(1.0 + 3.0 * 2f32.powi(-11)), 0x3c02);
        // Just above halfway rounds up.
        assert_eq!(f16_bits(1.0 + 2f32.powi(-11) + 2f32.powi(-20)), 0x3c01);
        // Overflow saturates instead of becoming infinity; tiny values go to (signed) zero.
        assert_eq!(f16_value(f16_bits(1e6)), 65504.0);
        assert_eq!(f16_value(f16_bits(-1e6)), -65504.0);
        assert_eq!(f16_bits(1e-9), 0);
        assert_eq!(f16_bits(-1e-9), 0x8000);
        // Subnormal rounding: 1.5 * 2^-24 ties to the even 2 * 2^-24.
        assert_eq!(f16_bits(1.5 * 2f32.powi(-24)), 2);
        // Rounding into the smallest normal.
        assert_eq!(f16_bits(6.1035156e-5 - 2f32.powi(-26)), 0x0400);
        // Every binary16 value round-trips (an independent check of both directions).
        for h in 0..0x7c00u16 {
            assert_eq!(f16_bits(f16_value(h)), h, "{h:#x}");
            assert_eq!(f16_bits(-f16_value(h)), h | 0x8000, "-{h:#x}");
        }
    }

    #[test]
    fn f16_error_is_at_most_half_a_unit_in_the_last_place() {
        let mut rng = Rng::new(3);
        for _ in 0..100_000 {
            let x = ((rng.next_f64() - 0.5) * 2.0 * 10f64.powi(rng.below(9) as i32 - 6)) as f32;
            let y = f16_value(f16_bits(x));
            let ulp = if x.abs() < 6.1035156e-5 { 2f32.powi(-24) } else { 2f32.powi(x.abs().log2().floor() as i32 - 10) };
            assert!((x - y).abs() <= ulp / 2.0 * 1.0001, "{x} -> {y}");
        }
    }

    /// Encode and decode: the bytes are `encoded_len`; without a residual the decoded values are
    /// the rounded ones; with one, values + residual before == decoded + residual after, exactly
    /// (no mass lost), send after send.
    #[test]
    fn fp16_round_trips_and_error_feedback_loses_nothing() {
        let mut rng = Rng::new(11);
        let values: Vec<f32> = (0..500).map(|i| (rng.normal() * 10f64.powi(i % 9 - 6)) as f32).collect();
        let mut out = Vec::new();
        Fp16.encode(&values, None, &mut out);
        assert_eq!(out.len(), Fp16.encoded_len(values.len()));
        let mut back = Vec::new();
        Fp16.decode(&out, values.len(), &mut back).unwrap();
        assert_eq!(back, values.iter().map(|&x| f16_value(f16_bits(x))).collect::<Vec<_>>());
        assert!(Fp16.decode(&out[1..], values.len(), &mut Vec::new()).is_err(), "a byte short");
        let mut residual = vec![0f32; values.len()];
        for _ in 0..5 {
            let before = residual.clone();
            let mut out = Vec::new();
            Fp16.encode(&values, Some(&mut residual), &mut out);
            assert_eq!(out.len(), Fp16.encoded_len(values.len()));
            let mut sent = Vec::new();
            Fp16.decode(&out, values.len(), &mut sent).unwrap();
            for i in 0..values.len() {
                let input = values[i] + before[i];
                assert_eq!(sent[i] as f64 + residual[i] as f64, input as f64, "value {i}: {} + {}", sent[i], residual[i]);
            }
        }
    }
}
