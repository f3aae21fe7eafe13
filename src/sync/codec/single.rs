//! Single precision on the wire: every value as its own IEEE 754 binary32 bits, little-endian, 4
//! bytes a value. Exact, so a residual given for error feedback is sent whole and left at zero.
//! What the parameter servers' rows carry unless `--compress fp16` asks for [`super::fp16`].

use super::ValueCodec;

/// Values exactly, as little-endian f32.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Single;

impl ValueCodec for Single {
    fn encoded_len(&self, n: usize) -> usize {
        4 * n
    }

    fn encode(&self, values: &[f32], residual: Option<&mut [f32]>, out: &mut Vec<u8>) {
        match residual {
            None => values.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Some(res) => {
                debug_assert_eq!(res.len(), values.len());
                for (&x, r) in values.iter().zip(res.iter_mut()) {
                    out.extend_from_slice(&(x + *r).to_le_bytes());
                    *r = 0.0;
                }
            }
        }
    }

    fn decode(&self, bytes: &[u8], n: usize, into: &mut Vec<f32>) -> anyhow::Result<()> {
        super::ensure_len(bytes, self.encoded_len(n), "single-precision", n)?;
        into.extend(bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_precision_round_trips_bit_for_bit() {
        let values = [0.0f32, -0.0, 1.5, -3.25e-30, f32::MAX, f32::MIN_POSITIVE, 1e-45];
        let mut out = Vec::new();
        Single.encode(&values, None, &mut out);
        assert_eq!(out.len(), Single.encoded_len(values.len()));
        let mut back = Vec::new();
        Single.decode(&out, values.len(), &mut back).unwrap();
        assert_eq!(back.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), values.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
        assert!(Single.decode(&out, values.len() + 1, &mut Vec::new()).is_err(), "4 bytes short");
        // Error feedback: the residual goes out with the values and is left at zero.
        let mut residual = vec![0.25f32; values.len()];
        let mut out = Vec::new();
        Single.encode(&[1.0; 7], Some(&mut residual), &mut out);
        assert_eq!(out.len(), Single.encoded_len(7));
        let mut sent = Vec::new();
        Single.decode(&out, 7, &mut sent).unwrap();
        assert_eq!((sent, residual), (vec![1.25; 7], vec![0.0; 7]));
    }
}
