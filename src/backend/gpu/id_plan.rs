//! The host side of MUL_MAT_ID's work layout (matmul.rs's module docs):
//! a routing's pairs grouped by expert, and each weight part's mat-vec and
//! GEMM work items over the experts that have pairs. A pure function of the
//! routing, tested here without a device.

use std::ops::Range;

use super::matmul::{tile_for, Tile, MV_TOK};
use crate::backend::{contract, BackendError};

/// The work items of one weight part: ranges of [`IdPlan::items`].
#[derive(Debug, PartialEq, Eq)]
pub(super) struct PartItems {
    /// Mat-vec items (experts with at most [`MV_TOK`] pairs).
    pub mv: Range<usize>,
    /// GEMM items (token tiles of experts with more).
    pub mm: Range<usize>,
}

/// The host side of MUL_MAT_ID: pairs grouped by expert and the work items
/// that touch only experts with pairs. A pure function of the routing.
#[derive(Debug)]
pub(super) struct IdPlan {
    /// Every expert's pairs back to back, in pair order within an expert:
    /// (input row of x, output row of y).
    pub toks: Vec<[u32; 2]>,
    /// (expert index inside its part, first pair in `toks`, pair count, 0).
    pub items: Vec<[u32; 4]>,
    /// Per weight part, its items.
    pub parts: Vec<PartItems>,
    /// The GEMM tile (its `bn` bounds the pairs of a GEMM item).
    pub tile: Tile,
}

impl IdPlan {
    /// `parts`: (first expert, expert count) of each weight part. Errors
    /// on an expert id outside `0..n_exp` ([`contract::expert_ids`]).
    pub(super) fn new(
        ids: &[u32],
        n_used: usize,
        x_per_tok: usize,
        n_exp: usize,
        parts: &[(usize, usize)],
    ) -> Result<IdPlan, BackendError> {
        contract::expert_ids("mul_mat_id", ids, n_exp)?;
        let mut off = vec![0usize; n_exp + 1];
        for &e in ids {
            off[e as usize + 1] += 1;
        }
        for e in 0..n_exp {
            off[e + 1] += off[e];
        }
        let mut fill = off.clone();
        let mut toks = vec![[0u32; 2]; ids.len()];
        for (r, &e) in ids.iter().enumerate() {
            let (t, j) = (r / n_used, r % n_used);
            let slot = &mut fill[e as usize];
            toks[*slot] = [(t * x_per_tok + j % x_per_tok) as u32, r as u32];
            *slot += 1;
        }
        let count = |e: usize| off[e + 1] - off[e];
        let (gemm_pairs, gemm_experts) = (0..n_exp)
            .map(count)
            .filter(|&c| c > MV_TOK)
            .fold((0, 0), |(p, e), c| (p + c, e + 1));
        let tile = tile_for(gemm_pairs / gemm_experts.max(1));
        let mut items: Vec<[u32; 4]> = Vec::new();
        let mut plan = Vec::with_capacity(parts.len());
        for &(first, n_in_part) in parts {
            let experts = first.min(n_exp)..(first + n_in_part).min(n_exp);
            let mv0 = items.len();
            for e in experts.clone() {
                let c = count(e);
                if c > 0 && c <= MV_TOK {
                    items.push([(e - first) as u32, off[e] as u32, c as u32, 0]);
                }
            }
            let mm0 = items.len();
            for e in experts {
                let c = count(e);
                if c > MV_TOK {
                    for s in (0..c).step_by(tile.bn as usize) {
                        let len = (tile.bn as usize).min(c - s);
                        items.push([(e - first) as u32, (off[e] + s) as u32, len as u32, 0]);
                    }
                }
            }
            plan.push(PartItems {
                mv: mv0..mm0,
                mm: mm0..items.len(),
            });
        }
        Ok(IdPlan {
            toks,
            items,
            parts: plan,
            tile,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_plan_touches_only_routed_experts() {
        // 12 tokens x 2 of 8 experts, in 3 parts; experts 1 and 5 get 12
        // and 8 pairs (GEMM), experts 3 and 6 two each (mat-vec), the rest none.
        let mut ids = Vec::new();
        for t in 0..12u32 {
            ids.push(1);
            ids.push(match t {
                0 | 5 => 3,
                1 | 7 => 6,
                _ => 5,
            });
        }
        for x_per_tok in [1, 2] {
            let p = IdPlan::new(&ids, 2, x_per_tok, 8, &[(0, 3), (3, 3), (6, 2)]).unwrap();
            // Every pair listed once, grouped by expert, with its input row.
            let mut outs: Vec<u32> = p.toks.iter().map(|t| t[1]).collect();
            outs.sort_unstable();
            assert_eq!(outs, (0..24).collect::<Vec<_>>());
            for &[x, y] in &p.toks {
                let (t, j) = (y as usize / 2, y as usize % 2);
                assert_eq!(x as usize, t * x_per_tok + j % x_per_tok);
            }
            // Items cover every pair exactly once, each inside its part.
            let mut covered = vec![0; 24];
            for (pi, (first, _)) in [(0usize, 3usize), (3, 3), (6, 2)].iter().enumerate() {
                let pp = &p.parts[pi];
                for (range, is_mv) in [(&pp.mv, true), (&pp.mm, false)] {
                    for it in &p.items[range.clone()] {
                        let e = first + it[0] as usize;
                        assert!(it[2] > 0 && (it[2] as usize <= MV_TOK) == is_mv);
                        for &[_, y] in &p.toks[it[1] as usize..(it[1] + it[2]) as usize] {
                            assert_eq!(ids[y as usize] as usize, e, "pair of another expert");
                            covered[y as usize] += 1;
                        }
                    }
                }
            }
            assert!(covered.iter().all(|&c| c == 1), "{covered:?}");
            // Experts 0, 2, 4, 7 have no items; 3 and 6 one mat-vec item each.
            assert_eq!(p.parts[0].mv.len(), 0);
            assert_eq!(p.parts[0].mm.len(), 1);
            assert_eq!(p.parts[1].mv.len(), 1);
            assert_eq!(p.parts[1].mm.len(), 1);
            assert_eq!(p.parts[2].mv.len(), 1);
            assert_eq!(p.parts[2].mm.len(), 0);
        }
        assert!(IdPlan::new(&[0, 8], 2, 1, 8, &[(0, 8)]).is_err());
    }
}
