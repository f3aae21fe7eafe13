//! The parameter servers' row codec: sparse rows of a flat model as they travel between workers
//! and servers (ssp, bosen, async), in single or half precision: the values of the listed rows
//! go through a value codec, [`Single`] or (`--compress fp16`) [`Fp16`].

use super::fp16::Fp16;
use super::single::Single;
use super::ValueCodec;

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
pub(crate) fn encode_rows(
    msg: &mut Vec<u8>,
    offsets: &[usize],
    rows: &[u32],
    versions: Option<&[u64]>,
    values: &[f32],
    half: bool,
) -> Vec<f32> {
    msg.extend_from_slice(&(rows.len() as u64).to_le_bytes());
    rows.iter().for_each(|r| msg.extend_from_slice(&r.to_le_bytes()));
    if let Some(v) = versions {
        debug_assert_eq!(v.len(), rows.len());
        v.iter().for_each(|x| msg.extend_from_slice(&x.to_le_bytes()));
    }
    let codec = value_codec(half);
    let mut sent = Vec::new();
    for &r in rows {
        let r = r as usize;
        let row = &values[offsets[r]..offsets[r + 1]];
        let at = msg.len();
        codec.encode(row, None, msg);
        if half {
            codec.decode(&msg[at..], row.len(), &mut sent).expect("the bytes just encoded");
        }
    }
    sent
}

/// Reads what [`encode_rows`] wrote (after `skip` header bytes), checked against the shard's
/// row offsets.
pub(crate) fn decode_rows(bytes: &[u8], skip: usize, offsets: &[usize], with_versions: bool, half: bool) -> anyhow::Result<RowBlock> {
    let word = |at: usize| -> Option<u64> { Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?)) };
    let bad = || anyhow::anyhow!("ssp protocol error: a malformed message of {} bytes", bytes.len());
    let count = word(skip).ok_or_else(bad)? as usize;
    let idx_end = skip + 8 + 4 * count;
    let rows: Vec<u32> =
        bytes.get(skip + 8..idx_end).ok_or_else(bad)?.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4"))).collect();
    let ver_end = idx_end + if with_versions { 8 * count } else { 0 };
    let versions: Vec<u64> =
        bytes.get(idx_end..ver_end).ok_or_else(bad)?.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8"))).collect();
    let nrows = offsets.len() - 1;
    let mut len = 0;
    for &r in &rows {
        anyhow::ensure!((r as usize) < nrows, "ssp protocol error: row {r} outside a shard of {nrows} rows");
        len += offsets[r as usize + 1] - offsets[r as usize];
    }
    anyhow::ensure!(
        bytes.len() == skip + encoded_len(offsets, &rows, with_versions, half),
        "ssp protocol error: {} bytes for {} rows of {len} values",
        bytes.len(),
        rows.len()
    );
    let mut values = Vec::with_capacity(len);
    value_codec(half).decode(&bytes[ver_end..], len, &mut values)?;
    Ok(RowBlock { rows, versions, values })
}

/// The little-endian u64 at byte `at` of a message (the header words of ssp's and bosen's
/// messages).
pub(crate) fn word_at(bytes: &[u8], at: usize) -> anyhow::Result<u64> {
    Ok(u64::from_le_bytes(
        bytes
            .get(at..at + 8)
            .ok_or_else(|| anyhow::anyhow!("ssp protocol error: a message of {} bytes has no header", bytes.len()))?
            .try_into()
            .expect("8 bytes"),
    ))
}

/// The bytes [`encode_rows`] appends for `rows` (local to a shard with row offsets `offsets`),
/// with or without their versions, in single or (`half`) half precision.
pub(crate) fn encoded_len(offsets: &[usize], rows: &[u32], versions: bool, half: bool) -> usize {
    let values: usize = rows.iter().map(|&r| offsets[r as usize + 1] - offsets[r as usize]).sum();
    8 + rows.len() * if versions { 12 } else { 4 } + value_codec(half).encoded_len(values)
}

/// The codec of the rows' values.
fn value_codec(half: bool) -> &'static dyn ValueCodec {
    if half {
        &Fp16
    } else {
        &Single
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        // What the sender keeps (its value minus what was sent) plus what was sent is its value,
        // exactly: no mass lost.
        assert_eq!(((0.1f32 - sent[0]) as f64) + sent[0] as f64, 0.1f32 as f64);
    }

    /// [`encoded_len`] is the bytes [`encode_rows`] appends, in every form; and every form
    /// decodes to what was sent.
    #[test]
    fn encoded_len_is_the_bytes_encoded() {
        let offsets = [0, 3, 3, 4, 9];
        let values: Vec<f32> = (0..9).map(|i| i as f32 * 0.37 - 1.0).collect();
        for rows in [&[][..], &[1], &[0, 3], &[0, 1, 2, 3]] {
            for with_versions in [false, true] {
                for half in [false, true] {
                    let versions: Vec<u64> = rows.iter().map(|&r| 100 + r as u64).collect();
                    let mut msg = vec![0u8; 5];
                    let sent = encode_rows(&mut msg, &offsets, rows, with_versions.then_some(&versions[..]), &values, half);
                    assert_eq!(msg.len(), 5 + encoded_len(&offsets, rows, with_versions, half), "{rows:?} {with_versions} {half}");
                    let b = decode_rows(&msg, 5, &offsets, with_versions, half).unwrap();
                    let row = |&r: &u32| values[offsets[r as usize]..offsets[r as usize + 1]].to_vec();
                    let exact: Vec<f32> = rows.iter().flat_map(row).collect();
                    assert_eq!(b.values, if half { sent } else { exact });
                    assert_eq!((b.rows, b.versions), (rows.to_vec(), if with_versions { versions } else { Vec::new() }));
                }
            }
        }
    }
}
