//! Column-layout ops on host activations: views with another shape, column
//! ranges of every group of columns (MLA's split of a head into its rotated
//! and plain parts), per-group concatenation, and gates applied per element
//! or per group. Shapes are checked by [`crate::backend::contract`].

use rayon::prelude::*;

use super::{grain, CpuTensor};
use crate::backend::{contract, Act, BackendError};

pub(super) fn reshape(t: CpuTensor, rows: usize, cols: usize) -> Result<CpuTensor, BackendError> {
    contract::reshape((t.rows, t.cols), rows, cols)?;
    Ok(CpuTensor {
        data: t.data,
        rows,
        cols,
    })
}

pub(super) fn split_cols(
    x: &CpuTensor,
    group: usize,
    start: usize,
    len: usize,
) -> Result<CpuTensor, BackendError> {
    let n_groups = contract::split_cols(x.cols, group, start, len)?;
    let mut out = CpuTensor::zeros(x.rows, n_groups * len);
    if len > 0 {
        out.data
            .chunks_mut(len)
            .zip(x.data.chunks(group))
            .for_each(|(d, s)| d.copy_from_slice(&s[start..start + len]));
    }
    Ok(out)
}

pub(super) fn concat_cols(
    a: &CpuTensor,
    ga: usize,
    b: &CpuTensor,
    gb: usize,
) -> Result<CpuTensor, BackendError> {
    let n_groups = contract::concat_cols((a.rows, a.cols), ga, (b.rows, b.cols), gb)?;
    let mut out = CpuTensor::zeros(a.rows, n_groups * (ga + gb));
    for (i, d) in out.data.chunks_mut(ga + gb).enumerate() {
        d[..ga].copy_from_slice(&a.data[i * ga..(i + 1) * ga]);
        d[ga..].copy_from_slice(&b.data[i * gb..(i + 1) * gb]);
    }
    Ok(out)
}

/// `x *= act(g)` with `g` broadcast over groups of `x.cols / g.cols`
/// columns: ggml-cpu's unary op (one `act` per gate value, libm `expf` /
/// `logf`; SiLU over each row of `g` as `ggml_vec_silu_f32`) then
/// `ggml_mul`, bit for bit.
pub(super) fn mul_act(x: &mut CpuTensor, g: &CpuTensor, act: Act) -> Result<(), BackendError> {
    let per = contract::mul_act((x.rows, x.cols), (g.rows, g.cols))?;
    if x.data.is_empty() {
        return Ok(());
    }
    x.data
        .par_chunks_mut(x.cols)
        .zip(g.data.par_chunks(g.cols))
        .with_min_len(grain::min_items(x.cols * grain::EXP))
        .for_each(|(row, gates)| {
            // ggml applies the activation to the gate tensor first, row by
            // row (SiLU's vector blocks depend on the row).
            let mut silu = Vec::new();
            let gates = if act == Act::Silu {
                silu.extend_from_slice(gates);
                super::recurrent::silu_row(&mut silu);
                &silu[..]
            } else {
                gates
            };
            for (seg, &gv) in row.chunks_mut(per).zip(gates) {
                let a = if act == Act::Silu { gv } else { act.apply(gv) };
                seg.iter_mut().for_each(|v| *v *= a);
            }
        });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seeded values in `[-scale, scale)`, never all zero.
    fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    }

    fn tensor(rows: usize, cols: usize, seed: u64) -> CpuTensor {
        CpuTensor {
            data: values(rows * cols, seed, 4.0),
            rows,
            cols,
        }
    }

    fn is_shape<T>(r: Result<T, BackendError>, op: &str) -> bool {
        matches!(r, Err(BackendError::Shape { op: o, .. }) if o == op)
    }

    #[test]
    fn reshape_keeps_the_data_and_checks_the_count() {
        let t = tensor(4, 6, 1);
        let r = reshape(t.clone(), 8, 3).unwrap();
        assert_eq!((r.rows, r.cols), (8, 3));
        assert_eq!(r.data, t.data);
        assert!(is_shape(reshape(t, 5, 5), "reshape"));
    }

    #[test]
    fn split_cols_takes_a_range_of_every_group() {
        let (rows, n_groups, group) = (3, 4, 10);
        let x = tensor(rows, n_groups * group, 2);
        for (start, len) in [(0, 10), (0, 7), (7, 3), (4, 0), (2, 5)] {
            let y = split_cols(&x, group, start, len).unwrap();
            assert_eq!((y.rows, y.cols), (rows, n_groups * len));
            for r in 0..rows {
                for h in 0..n_groups {
                    for c in 0..len {
                        assert_eq!(
                            y.data[r * n_groups * len + h * len + c],
                            x.data[r * n_groups * group + h * group + start + c],
                            "start {start} len {len} at ({r}, {h}, {c})"
                        );
                    }
                }
            }
        }
        // A whole row as one group: a column range.
        let y = split_cols(&x, x.cols, 5, 20).unwrap();
        assert_eq!(y.data[..20], x.data[5..25]);
        assert!(
            is_shape(split_cols(&x, 7, 0, 1), "split_cols"),
            "7 does not divide 40"
        );
        assert!(is_shape(split_cols(&x, 0, 0, 0), "split_cols"), "group 0");
        assert!(
            is_shape(split_cols(&x, 10, 8, 3), "split_cols"),
            "past the group"
        );
    }

    #[test]
    fn concat_cols_interleaves_groups() {
        let (rows, n_groups) = (5, 3);
        for (ga, gb) in [(4, 2), (1, 7), (0, 3), (3, 0)] {
            let a = tensor(rows, n_groups * ga, 3);
            let b = tensor(rows, n_groups * gb, 4);
            let y = concat_cols(&a, ga, &b, gb).unwrap();
            let w = ga + gb;
            assert_eq!((y.rows, y.cols), (rows, n_groups * w));
            for r in 0..rows {
                for h in 0..n_groups {
                    for c in 0..w {
                        let want = if c < ga {
                            a.data[(r * n_groups + h) * ga + c]
                        } else {
                            b.data[(r * n_groups + h) * gb + c - ga]
                        };
                        assert_eq!(y.data[(r * n_groups + h) * w + c], want);
                    }
                }
            }
            // split_cols undoes it.
            if ga > 0 {
                assert_eq!(split_cols(&y, w, 0, ga).unwrap(), a);
            }
            if gb > 0 {
                assert_eq!(split_cols(&y, w, ga, gb).unwrap(), b);
            }
        }
        let a = tensor(5, 12, 5);
        assert!(
            is_shape(concat_cols(&a, 4, &tensor(4, 6, 6), 2), "concat_cols"),
            "rows"
        );
        assert!(
            is_shape(concat_cols(&a, 4, &tensor(5, 8, 6), 2), "concat_cols"),
            "groups"
        );
        assert!(
            is_shape(concat_cols(&a, 5, &tensor(5, 6, 6), 2), "concat_cols"),
            "ragged"
        );
    }

    /// ggml-cpu's `op_sigmoid` and `op_softplus` (unary-ops.cpp), written out.
    fn ggml_act(act: Act, x: f32) -> f32 {
        match act {
            Act::Sigmoid => 1.0f32 / (1.0f32 + f32::exp(-x)),
            Act::Softplus => {
                if x > 20.0f32 {
                    x
                } else {
                    f32::ln(1.0f32 + f32::exp(x))
                }
            }
            Act::Silu => x / (1.0f32 + f32::exp(-x)),
        }
    }

    #[test]
    fn mul_act_is_ggmls_gate_bit_for_bit() {
        let (rows, n_head, head_dim) = (7, 6, 16);
        let cols = n_head * head_dim;
        let x0 = tensor(rows, cols, 7);
        for act in [Act::Sigmoid, Act::Softplus] {
            // Per element (Laguna M.1, Qwen3-Next) and per head (Laguna XS.2).
            for g_cols in [cols, n_head, 1] {
                let mut g = tensor(rows, g_cols, 8);
                // Around and beyond softplus's threshold of 20, and large
                // negatives where sigmoid underflows.
                for (i, v) in [20.0f32, 20.000002, 19.999998, 30.0, -30.0, -100.0, 0.0]
                    .iter()
                    .enumerate()
                {
                    let n = g.data.len();
                    g.data[i % n] = *v;
                }
                let mut x = x0.clone();
                mul_act(&mut x, &g, act).unwrap();
                let per = cols / g_cols;
                for r in 0..rows {
                    for c in 0..cols {
                        let want =
                            x0.data[r * cols + c] * ggml_act(act, g.data[r * g_cols + c / per]);
                        let got = x.data[r * cols + c];
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{act:?} gate of {g_cols} at ({r}, {c}): {got} vs {want}"
                        );
                    }
                }
            }
        }
        assert_eq!(Act::Softplus.apply(21.0), 21.0);
        assert_eq!(Act::Softplus.apply(0.0), std::f32::consts::LN_2);
        assert_eq!(Act::Sigmoid.apply(0.0), 0.5);
        let mut x = x0.clone();
        assert!(
            is_shape(
                mul_act(&mut x, &tensor(rows, 5, 9), Act::Sigmoid),
                "mul_act"
            ),
            "5 does not divide 96"
        );
        assert!(
            is_shape(
                mul_act(&mut x, &tensor(rows + 1, n_head, 9), Act::Sigmoid),
                "mul_act"
            ),
            "rows"
        );
        assert!(
            is_shape(
                mul_act(&mut x, &tensor(rows, 0, 9), Act::Softplus),
                "mul_act"
            ),
            "empty gate"
        );
        assert_eq!(x, x0, "a refused gate leaves x alone");
    }
}
