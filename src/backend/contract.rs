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
    expert_ids(ids, n_expert)?;
    Ok(MulMatId { n_tok, x_per_tok })
}

/// The part of [`mul_mat_id`]'s contract that routing code indexing by
/// expert relies on: every id is below `n_expert`.
pub fn expert_ids(ids: &[u32], n_expert: usize) -> Result<(), BackendError> {
    match ids.iter().find(|&&e| e as usize >= n_expert) {
        Some(&e) => Err(shape("mul_mat_id", format!("expert id {e} >= {n_expert}"))),
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
