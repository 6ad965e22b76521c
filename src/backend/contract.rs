//! Op contracts, checked once for every backend: one validating function per
//! op that takes only shapes (and the routing ids), returns what the op's
//! implementations need to know about them, or the op's
//! [`BackendError::Shape`] error. Both backends call these before they
//! compute, so each check and its message exist once; a backend adds only
//! what its own kernels assume (byte lengths, supported weight types, 32-bit
//! indices). This module knows no device, no dtype and no tensor type.

use super::BackendError;

fn shape(op: &'static str, detail: String) -> BackendError {
    BackendError::Shape { op, detail }
}

/// The contract of [`super::Backend::matmul`]: a weight `[k, n]` (one
/// matrix, not a stack of experts) and `x [t, k]`.
pub fn matmul(k: usize, n_mat: usize, x_cols: usize) -> Result<(), BackendError> {
    const OP: &str = "matmul";
    if n_mat != 1 {
        return Err(shape(
            OP,
            format!("weight of {n_mat} stacked matrices; use mul_mat_id"),
        ));
    }
    if x_cols != k {
        return Err(shape(
            OP,
            format!("weight rows of {k} for inputs of {x_cols}"),
        ));
    }
    Ok(())
}

/// What [`mul_mat_id`] found out about a valid call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MulMatId {
    /// Tokens (`ids.len() / n_used`).
    pub n_tok: usize,
    /// Input rows per token: 1 (every expert reads the token's row) or
    /// `n_used` (row `t * n_used + j` is the input of pair `(t, j)`). 1 when
    /// there are no tokens.
    pub x_per_tok: usize,
}

/// The contract of [`super::Backend::mul_mat_id`]: a stacked weight
/// `[k, n, n_expert]`, `x [x_rows, x_cols]` with `x_cols == k` and
/// `x_rows == n_tok` or `n_tok * n_used`, `ids [n_tok, n_used]` each below
/// `n_expert`, `n_used > 0`. No tokens is valid (an empty result, whatever
/// `x`'s rows).
pub fn mul_mat_id(
    k: usize,
    n_expert: usize,
    (x_rows, x_cols): (usize, usize),
    ids: &[u32],
    n_used: usize,
) -> Result<MulMatId, BackendError> {
    const OP: &str = "mul_mat_id";
    if x_cols != k {
        return Err(shape(
            OP,
            format!("weight rows of {k} for inputs of {x_cols}"),
        ));
    }
    if n_used == 0 || !ids.len().is_multiple_of(n_used) {
        return Err(shape(
            OP,
            format!("{} ids in groups of {n_used}", ids.len()),
        ));
    }
    let n_tok = ids.len() / n_used;
    if n_tok == 0 {
        return Ok(MulMatId {
            n_tok,
            x_per_tok: 1,
        });
    }
    let x_per_tok = x_rows / n_tok;
    if !x_rows.is_multiple_of(n_tok) || !(x_per_tok == 1 || x_per_tok == n_used) {
        return Err(shape(
            OP,
            format!("{x_rows} input rows for {n_tok} tokens x {n_used} experts"),
        ));
    }
    expert_ids(OP, ids, n_expert)?;
    Ok(MulMatId { n_tok, x_per_tok })
}

/// The part of [`mul_mat_id`]'s and [`add_bias_id`]'s contracts that code
/// indexing by expert relies on: every id is below `n_expert`.
pub fn expert_ids(op: &'static str, ids: &[u32], n_expert: usize) -> Result<(), BackendError> {
    match ids.iter().find(|&&e| e as usize >= n_expert) {
        Some(&e) => Err(shape(op, format!("expert id {e} >= {n_expert}"))),
        None => Ok(()),
    }
}

/// The contract of [`super::Backend::reshape`]: `[rows, cols]` viewed as
/// `[rows2, cols2]` holds the same number of elements.
pub fn reshape(
    (rows, cols): (usize, usize),
    rows2: usize,
    cols2: usize,
) -> Result<(), BackendError> {
    if rows.checked_mul(cols) != rows2.checked_mul(cols2) {
        return Err(shape(
            "reshape",
            format!("[{rows}, {cols}] viewed as [{rows2}, {cols2}]"),
        ));
    }
    Ok(())
}

/// The contract of [`super::Backend::split_cols`]: `group > 0` divides
/// `cols`, and `start..start + len` lies inside a group. Returns the number
/// of groups `G`; the result is `[rows, G * len]`.
pub fn split_cols(
    cols: usize,
    group: usize,
    start: usize,
    len: usize,
) -> Result<usize, BackendError> {
    if group == 0 || !cols.is_multiple_of(group) || start.checked_add(len).is_none_or(|e| e > group)
    {
        return Err(shape(
            "split_cols",
            format!("columns {start}..{start}+{len} of groups of {group} over rows of {cols}"),
        ));
    }
    Ok(cols / group)
}

/// The contract of [`super::Backend::concat_cols`]: `a [rows, G * ga]` and
/// `b [rows, G * gb]` with the same rows and the same group count `G`
/// (`ga + gb > 0`; a group of zero columns on one side is allowed).
/// Returns `G`; the result is `[rows, G * (ga + gb)]`.
pub fn concat_cols(
    (a_rows, a_cols): (usize, usize),
    ga: usize,
    (b_rows, b_cols): (usize, usize),
    gb: usize,
) -> Result<usize, BackendError> {
    let groups = |cols: usize, g: usize| match g {
        0 => (cols == 0).then_some(None),
        g => cols.is_multiple_of(g).then_some(Some(cols / g)),
    };
    let n = match (groups(a_cols, ga), groups(b_cols, gb)) {
        (Some(Some(na)), Some(Some(nb))) if na == nb => Some(na),
        (Some(Some(n)), Some(None)) | (Some(None), Some(Some(n))) => Some(n),
        _ => None,
    };
    match n {
        Some(n) if a_rows == b_rows => Ok(n),
        _ => Err(shape(
            "concat_cols",
            format!("[{a_rows}, {a_cols}] in groups of {ga} with [{b_rows}, {b_cols}] in groups of {gb}"),
        )),
    }
}

/// The contract of [`super::Backend::mul_act`]: `x [rows, cols]` and its gate
/// `g [rows, g_cols]`, `g_cols > 0` dividing `cols`. Returns the columns of
/// `x` each gate value covers (`cols / g_cols`: 1 for a gate per element,
/// `head_dim` for one per head).
pub fn mul_act(
    (rows, cols): (usize, usize),
    (g_rows, g_cols): (usize, usize),
) -> Result<usize, BackendError> {
    if g_rows != rows || g_cols == 0 || !cols.is_multiple_of(g_cols) {
        return Err(shape(
            "mul_act",
            format!("x [{rows}, {cols}] gated by [{g_rows}, {g_cols}]"),
        ));
    }
    Ok(cols / g_cols)
}

/// The contract of [`super::Backend::mul_vec`]: a weight of one value per
/// column.
pub fn mul_vec(cols: usize, w_len: usize) -> Result<(), BackendError> {
    if w_len != cols {
        return Err(shape(
            "mul_vec",
            format!("a vector of {w_len} for rows of {cols}"),
        ));
    }
    Ok(())
}

/// The contract of [`super::Backend::l2_norm`]: `group > 0` divides `cols`.
pub fn l2_norm(cols: usize, group: usize) -> Result<(), BackendError> {
    if group == 0 || !cols.is_multiple_of(group) {
        return Err(shape(
            "l2_norm",
            format!("groups of {group} over rows of {cols}"),
        ));
    }
    Ok(())
}

/// Sequences' rows: the sum of `seqs[i].n_tokens` must be `rows`, and
/// there must be one state per sequence.
fn seq_rows(
    op: &'static str,
    rows: usize,
    n_states: usize,
    seqs: &[super::BatchPos],
) -> Result<(), BackendError> {
    let n: usize = seqs.iter().map(|s| s.n_tokens).sum();
    if n != rows || n_states != seqs.len() {
        return Err(shape(
            op,
            format!(
                "{rows} rows and {n_states} states for {} sequences of {n} tokens",
                seqs.len()
            ),
        ));
    }
    Ok(())
}

/// The contract of [`super::Backend::ssm_conv`]: `x [n, C]`, a weight of
/// ggml dims `[d_conv, C]` with `d_conv >= 2`, one state `[d_conv - 1, C]`
/// per sequence, the sequences' tokens summing to `n`. Returns `d_conv`.
pub fn ssm_conv(
    (rows, cols): (usize, usize),
    w_dims: &[u64],
    states: &[(usize, usize)],
    seqs: &[super::BatchPos],
) -> Result<usize, BackendError> {
    const OP: &str = "ssm_conv";
    let d_conv = match w_dims {
        [k, c] if *c == cols as u64 && *k >= 2 => *k as usize,
        _ => {
            return Err(shape(
                OP,
                format!(
                    "a kernel of dims {w_dims:?} for {cols} channels (want [d_conv >= 2, {cols}])"
                ),
            ))
        }
    };
    if let Some(s) = states.iter().find(|s| **s != (d_conv - 1, cols)) {
        return Err(shape(
            OP,
            format!(
                "a state [{}, {}] for a kernel of {d_conv} over {cols} channels",
                s.0, s.1
            ),
        ));
    }
    seq_rows(OP, rows, states.len(), seqs).map(|_| d_conv)
}

/// The contract of [`super::Backend::gated_delta_net`]: non-zero head
/// counts with `n_v_heads` a multiple of `n_k_heads` and a non-zero head
/// size `S`; `q`, `k` `[n, n_k_heads * S]`, `v` `[n, n_v_heads * S]`, `g`,
/// `beta` `[n, n_v_heads]`, one state `[n_v_heads, S * S]` per sequence,
/// the sequences' tokens summing to `n`.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_net(
    p: &super::DeltaNetParams,
    q: (usize, usize),
    k: (usize, usize),
    v: (usize, usize),
    g: (usize, usize),
    beta: (usize, usize),
    states: &[(usize, usize)],
    seqs: &[super::BatchPos],
) -> Result<(), BackendError> {
    const OP: &str = "gated_delta_net";
    let (hk, hv, s) = (p.n_k_heads, p.n_v_heads, p.head_dim);
    if hk == 0 || hv == 0 || s == 0 || !hv.is_multiple_of(hk) {
        return Err(shape(
            OP,
            format!("{hk} key heads / {hv} value heads of {s}: want non-zero sizes, value heads a multiple of key heads"),
        ));
    }
    let n = q.0;
    let want = [(n, hk * s), (n, hk * s), (n, hv * s), (n, hv), (n, hv)];
    if [q, k, v, g, beta] != want {
        return Err(shape(
            OP,
            format!("q {q:?}, k {k:?}, v {v:?}, g {g:?}, beta {beta:?} for {hk} key / {hv} value heads of {s}"),
        ));
    }
    if let Some(st) = states.iter().find(|st| **st != (hv, s * s)) {
        return Err(shape(
            OP,
            format!(
                "a state {st:?} for {hv} value heads of {s} (want [{hv}, {}])",
                s * s
            ),
        ));
    }
    seq_rows(OP, n, states.len(), seqs)
}

/// The contract of [`super::Backend::gather_rows`]: every row index is
/// below `x_rows`.
pub fn gather_rows(x_rows: usize, rows: &[usize]) -> Result<(), BackendError> {
    match rows.iter().find(|&&r| r >= x_rows) {
        Some(r) => Err(shape("gather_rows", format!("row {r} of {x_rows}"))),
        None => Ok(()),
    }
}

/// The contract of [`super::Backend::scatter_rows`]: `src [rows.len(), n]`
/// into `dst [.., n]`, every row index below `dst`'s rows.
pub fn scatter_rows(
    (dst_rows, dst_cols): (usize, usize),
    (src_rows, src_cols): (usize, usize),
    rows: &[usize],
) -> Result<(), BackendError> {
    if src_cols != dst_cols || src_rows != rows.len() || rows.iter().any(|&r| r >= dst_rows) {
        return Err(shape(
            "scatter_rows",
            format!(
                "[{src_rows}, {src_cols}] into [{dst_rows}, {dst_cols}] at {} rows",
                rows.len()
            ),
        ));
    }
    Ok(())
}

/// The contract of [`super::Backend::add`]: the same shapes.
pub fn add(a: (usize, usize), b: (usize, usize)) -> Result<(), BackendError> {
    if a != b {
        return Err(shape(
            "add",
            format!("[{}, {}] + [{}, {}]", a.0, a.1, b.0, b.1),
        ));
    }
    Ok(())
}

/// The contract of [`super::Backend::add_bias`]: a bias of `x_cols` values.
pub fn add_bias(x_cols: usize, bias_len: usize) -> Result<(), BackendError> {
    if bias_len != x_cols {
        return Err(shape(
            "add_bias",
            format!("bias of {bias_len} for rows of {x_cols}"),
        ));
    }
    Ok(())
}

/// The contract of [`super::Backend::add_bias_id`]: `x [t * n_used, n]`, a
/// stacked bias `[n, n_expert]` and one id below `n_expert` per row of `x`.
pub fn add_bias_id(
    (x_rows, x_cols): (usize, usize),
    (n, n_expert): (usize, usize),
    ids: &[u32],
) -> Result<(), BackendError> {
    const OP: &str = "add_bias_id";
    if n != x_cols || ids.len() != x_rows {
        return Err(shape(
            OP,
            format!(
                "bias rows of {n}, {} ids for [{x_rows}, {x_cols}]",
                ids.len()
            ),
        ));
    }
    expert_ids(OP, ids, n_expert)
}

/// The contract of [`super::Backend::scale_rows`]: one scale per row.
pub fn scale_rows(x_rows: usize, n_scales: usize) -> Result<(), BackendError> {
    if n_scales != x_rows {
        return Err(shape(
            "scale_rows",
            format!("{n_scales} scales for {x_rows} rows"),
        ));
    }
    Ok(())
}

/// The contract of [`super::Backend::rms_norm`]: `group > 0` divides the
/// rows' `cols` and the weight holds `group` values.
pub fn rms_norm(cols: usize, group: usize, weight_len: usize) -> Result<(), BackendError> {
    if group == 0 || !cols.is_multiple_of(group) || weight_len != group {
        return Err(shape(
            "rms_norm",
            format!("groups of {group} over rows of {cols} with a weight of {weight_len}"),
        ));
    }
    Ok(())
}

/// The contract of [`super::Backend::rope`] (and `rope_multi`): rows of
/// whole heads of `head_dim > 0`, an even `n_rot <= head_dim`, one row per
/// token of the batch.
pub fn rope(
    (x_rows, x_cols): (usize, usize),
    head_dim: usize,
    n_rot: usize,
    n_tokens: usize,
) -> Result<(), BackendError> {
    if head_dim == 0
        || !x_cols.is_multiple_of(head_dim)
        || n_rot > head_dim
        || !n_rot.is_multiple_of(2)
        || x_rows != n_tokens
    {
        return Err(shape(
            "rope",
            format!(
                "rows of {x_cols} in heads of {head_dim}, n_rot {n_rot}, {x_rows} rows for {n_tokens} tokens"
            ),
        ));
    }
    Ok(())
}

/// The contract of [`super::Backend::glu`]: gate and up of the same shape.
pub fn glu(gate: (usize, usize), up: (usize, usize)) -> Result<(), BackendError> {
    if gate != up {
        return Err(shape(
            "glu",
            format!("gate [{}, {}] vs up [{}, {}]", gate.0, gate.1, up.0, up.1),
        ));
    }
    Ok(())
}

/// The contract of [`super::Backend::weighted_sum`]: rows in groups of
/// `n_used > 0`, one weight per row. Returns the tokens (`rows / n_used`).
pub fn weighted_sum(x_rows: usize, n_weights: usize, n_used: usize) -> Result<usize, BackendError> {
    if n_used == 0 || !x_rows.is_multiple_of(n_used) || n_weights != x_rows {
        return Err(shape(
            "weighted_sum",
            format!("{x_rows} rows in groups of {n_used} with {n_weights} weights"),
        ));
    }
    Ok(x_rows / n_used)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_shape(r: Result<impl std::fmt::Debug, BackendError>, op: &str) -> bool {
        matches!(r, Err(BackendError::Shape { op: o, .. }) if o == op)
    }

    #[test]
    fn matmul_contract() {
        assert!(matmul(8, 1, 8).is_ok());
        assert!(is_shape(matmul(8, 1, 7), "matmul"), "k");
        assert!(is_shape(matmul(8, 3, 8), "matmul"), "stacked experts");
    }

    #[test]
    fn mul_mat_id_contract() {
        let ok = |x, ids: &[u32], n_used| mul_mat_id(8, 4, x, ids, n_used);
        assert_eq!(
            ok((2, 8), &[0, 3, 1, 2], 2).unwrap(),
            MulMatId {
                n_tok: 2,
                x_per_tok: 1
            }
        );
        assert_eq!(ok((4, 8), &[0, 3, 1, 2], 2).unwrap().x_per_tok, 2);
        assert_eq!(ok((5, 8), &[], 2).unwrap().n_tok, 0);
        assert!(is_shape(ok((2, 7), &[0, 1], 1), "mul_mat_id"), "k");
        assert!(is_shape(ok((2, 8), &[0, 1], 0), "mul_mat_id"), "n_used 0");
        assert!(
            is_shape(ok((2, 8), &[0, 1, 2], 2), "mul_mat_id"),
            "ragged ids"
        );
        assert!(is_shape(ok((3, 8), &[0, 1, 2, 3], 2), "mul_mat_id"), "rows");
        assert!(is_shape(ok((6, 8), &[0, 1, 2, 3], 2), "mul_mat_id"), "rows");
        let e = ok((2, 8), &[0, 4], 1).unwrap_err().to_string();
        assert!(e.contains("expert id 4 >= 4"), "{e}");
    }

    #[test]
    fn row_and_elementwise_contracts() {
        assert!(gather_rows(3, &[0, 2, 2]).is_ok());
        assert!(is_shape(gather_rows(3, &[3]), "gather_rows"));
        assert!(scatter_rows((4, 2), (2, 2), &[3, 0]).is_ok());
        assert!(is_shape(
            scatter_rows((4, 2), (2, 3), &[3, 0]),
            "scatter_rows"
        ));
        assert!(is_shape(
            scatter_rows((4, 2), (2, 2), &[4, 0]),
            "scatter_rows"
        ));
        assert!(is_shape(
            scatter_rows((4, 2), (1, 2), &[3, 0]),
            "scatter_rows"
        ));
        assert!(add((2, 3), (2, 3)).is_ok());
        assert!(is_shape(add((2, 3), (3, 2)), "add"));
        assert!(add_bias(4, 4).is_ok());
        assert!(is_shape(add_bias(4, 5), "add_bias"));
        assert!(add_bias_id((2, 4), (4, 3), &[0, 2]).is_ok());
        assert!(is_shape(
            add_bias_id((2, 4), (4, 3), &[0, 3]),
            "add_bias_id"
        ));
        assert!(is_shape(
            add_bias_id((2, 4), (5, 3), &[0, 1]),
            "add_bias_id"
        ));
        assert!(is_shape(add_bias_id((2, 4), (4, 3), &[0]), "add_bias_id"));
        assert!(scale_rows(3, 3).is_ok());
        assert!(is_shape(scale_rows(3, 2), "scale_rows"));
        assert!(rms_norm(8, 4, 4).is_ok());
        assert!(is_shape(rms_norm(8, 3, 3), "rms_norm"));
        assert!(is_shape(rms_norm(8, 0, 0), "rms_norm"));
        assert!(is_shape(rms_norm(8, 4, 8), "rms_norm"));
        assert!(rope((2, 8), 4, 4, 2).is_ok());
        assert!(is_shape(rope((2, 8), 3, 2, 2), "rope"));
        assert!(is_shape(rope((2, 8), 4, 6, 2), "rope"));
        assert!(is_shape(rope((2, 8), 4, 3, 2), "rope"));
        assert!(is_shape(rope((2, 8), 4, 4, 3), "rope"));
        assert!(glu((2, 3), (2, 3)).is_ok());
        assert!(is_shape(glu((2, 3), (2, 4)), "glu"));
        assert_eq!(weighted_sum(6, 6, 3).unwrap(), 2);
        assert!(is_shape(weighted_sum(6, 6, 4), "weighted_sum"));
        assert!(is_shape(weighted_sum(6, 5, 3), "weighted_sum"));
        assert!(is_shape(weighted_sum(6, 6, 0), "weighted_sum"));
    }

    #[test]
    fn new_op_contracts() {
        assert!(reshape((4, 6), 8, 3).is_ok());
        assert!(reshape((0, 6), 0, 1).is_ok());
        assert!(is_shape(reshape((4, 6), 5, 5), "reshape"));
        assert!(is_shape(reshape((4, 6), usize::MAX, 2), "reshape"));

        assert_eq!(split_cols(12, 6, 2, 4).unwrap(), 2);
        assert_eq!(split_cols(12, 6, 6, 0).unwrap(), 2);
        assert!(
            is_shape(split_cols(12, 5, 0, 1), "split_cols"),
            "group does not divide"
        );
        assert!(is_shape(split_cols(12, 0, 0, 0), "split_cols"), "group 0");
        assert!(
            is_shape(split_cols(12, 6, 3, 4), "split_cols"),
            "past the group"
        );
        assert!(
            is_shape(split_cols(12, 6, usize::MAX, 2), "split_cols"),
            "overflow"
        );

        assert_eq!(concat_cols((3, 8), 4, (3, 6), 3).unwrap(), 2);
        assert_eq!(concat_cols((3, 0), 0, (3, 6), 3).unwrap(), 2);
        assert!(
            is_shape(concat_cols((3, 8), 4, (2, 6), 3), "concat_cols"),
            "rows"
        );
        assert!(
            is_shape(concat_cols((3, 8), 4, (3, 9), 3), "concat_cols"),
            "groups"
        );
        assert!(
            is_shape(concat_cols((3, 8), 3, (3, 6), 3), "concat_cols"),
            "ragged"
        );
        assert!(
            is_shape(concat_cols((3, 0), 0, (3, 0), 0), "concat_cols"),
            "empty"
        );

        assert_eq!(mul_act((3, 8), (3, 8)).unwrap(), 1);
        assert_eq!(mul_act((3, 8), (3, 2)).unwrap(), 4);
        assert!(
            is_shape(mul_act((3, 8), (3, 3)), "mul_act"),
            "per does not divide"
        );
        assert!(is_shape(mul_act((3, 8), (3, 0)), "mul_act"), "empty gate");
        assert!(is_shape(mul_act((3, 8), (2, 8)), "mul_act"), "rows");
    }
}
