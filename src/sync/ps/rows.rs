//! The parameter servers' row codec: sparse rows of a flat model as they travel between workers
//! and servers (ssp, bosen, async), in single or half precision.

/// Sparse rows as they travel: local row indices, optional per-row versions, and the values of
/// the listed rows in order.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct RowBlock {
    pub(crate) rows: Vec<u32>,
    pub(crate) versions: Vec<u64>,
    pub(crate) values: Vec<f32>,
}

/// Appends sparse rows to a message: `[count u64][local row index u32 ...][version u64 ...]`
/// `[values f32 or f16 ...]`, the values of the listed rows in order (versions only when given).
/// Sparse because a mini-batch touches few rows of a big model: MF on MovieLens changes at most
/// 64 of 9,737 rows per step, and dense pushes and answers sent 9 GB per rank where the changed
/// rows are a few percent of that. With `half`, returns the values as the receiver will decode
/// them (the sender keeps the difference).
pub(crate) fn encode_rows(msg: &mut Vec<u8>, offsets: &[usize], rows: &[u32], versions: Option<&[u64]>, values: &[f32], half: bool) -> Vec<f32> {
    msg.extend_from_slice(&(rows.len() as u64).to_le_bytes());
    rows.iter().for_each(|r| msg.extend_from_slice(&r.to_le_bytes()));
    if let Some(v) = versions {
        debug_assert_eq!(v.len(), rows.len());
        v.iter().for_each(|x| msg.extend_from_slice(&x.to_le_bytes()));
    }
    let mut sent = Vec::new();
    for &r in rows {
        let r = r as usize;
        for &x in &values[offsets[r]..offsets[r + 1]] {
            if half {
                let h = f16_bits(x);
                msg.extend_from_slice(&h.to_le_bytes());
                sent.push(f16_value(h));
            } else {
                msg.extend_from_slice(&x.to_le_bytes());
            }
        }
    }
    sent
}

/// Reads what [`encode_rows`] wrote (after `skip` header bytes), checked against the shard's
/// row offsets.
pub(crate) fn decode_rows(bytes: &[u8], skip: usize, offsets: &[usize], versions: bool, half: bool) -> anyhow::Result<RowBlock> {
    let word = |at: usize| -> Option<u64> { Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?)) };
    let bad = || anyhow::anyhow!("ssp protocol error: a malformed message of {} bytes", bytes.len());
    let count = word(skip).ok_or_else(bad)? as usize;
    let idx_end = skip + 8 + 4 * count;
    let rows: Vec<u32> = bytes.get(skip + 8..idx_end).ok_or_else(bad)?.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4"))).collect();
    let ver_end = idx_end + if versions { 8 * count } else { 0 };
    let versions: Vec<u64> = bytes.get(idx_end..ver_end).ok_or_else(bad)?.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8"))).collect();
    let nrows = offsets.len() - 1;
    let mut len = 0;
    for &r in &rows {
        anyhow::ensure!((r as usize) < nrows, "ssp protocol error: row {r} outside a shard of {nrows} rows");
        len += offsets[r as usize + 1] - offsets[r as usize];
    }
    let width = if half { 2 } else { 4 };
    anyhow::ensure!(bytes.len() == ver_end + width * len, "ssp protocol error: {} bytes for {} rows of {len} values", bytes.len(), rows.len());
    let values = if half {
        bytes[ver_end..].chunks_exact(2).map(|c| f16_value(u16::from_le_bytes(c.try_into().expect("2")))).collect()
    } else {
        decode_f32(&bytes[ver_end..])
    };
    Ok(RowBlock { rows, versions, values })
}

pub(crate) fn word_at(bytes: &[u8], at: usize) -> anyhow::Result<u64> {
    Ok(u64::from_le_bytes(
        bytes.get(at..at + 8).ok_or_else(|| anyhow::anyhow!("ssp protocol error: a message of {} bytes has no header", bytes.len()))?.try_into().expect("8 bytes"),
    ))
}

/// Little-endian f32 values.
pub(crate) fn decode_f32(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect()
}

/// Half the smallest binary16 subnormal, 2^-25: anything smaller encodes as zero.
pub(crate) const F16_HALF_MIN: f32 = 2.980_232_2e-8;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    #[test]
    fn sparse_rows_round_trip_and_reject_malformed_messages() {
        let offsets = [0, 2, 3, 6];
        let values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let mut msg = 7u64.to_le_bytes().to_vec();
        encode_rows(&mut msg, &offsets, &[0, 2], None, &values, false);
        let b = decode_rows(&msg, 8, &offsets, false, false).unwrap();
        assert_eq!((b.rows, b.values), (vec![0, 2], vec![1.0, 2.0, 4.0, 5.0, 6.0]));
        assert!(decode_rows(&msg[..msg.len() - 1], 8, &offsets, false, false).is_err(), "truncated");
        assert!(decode_rows(&msg, 8, &[0, 2], false, false).is_err(), "row 2 outside a one-row shard");
        assert!(decode_rows(&msg, 8, &offsets, true, false).is_err(), "versions missing");
        // Half precision with versions: half the value bytes, values rounded.
        let mut msg = 7u64.to_le_bytes().to_vec();
        let sent = encode_rows(&mut msg, &offsets, &[2], Some(&[9]), &[0.0, 0.0, 0.0, 0.1, 1.0, -3.0], true);
        assert_eq!(msg.len(), 8 + 8 + 4 + 8 + 3 * 2);
        let b = decode_rows(&msg, 8, &offsets, true, true).unwrap();
        assert_eq!((b.rows, b.versions), (vec![2], vec![9]));
        assert_eq!(b.values, sent);
        assert_eq!(b.values[1..], [1.0, -3.0]);
        assert!((b.values[0] - 0.1).abs() < 1e-4 && b.values[0] != 0.1f32);
    }

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
}
