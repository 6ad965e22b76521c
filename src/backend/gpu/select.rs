//! Kernel selection from the adapter's capabilities, in one place and as
//! pure functions of [`Caps`], so that every choice is tested with made-up
//! adapters (an adapter without f16, without subgroups, with subgroups of
//! 4 to 128, with small bindings) on any machine.

use super::Caps;
use crate::tensor::GgmlType;

/// Workgroup size of the quantised mat-vec: a power of two of at least 64
/// (and at most 256) holding the adapter's largest subgroup.
pub(super) fn matvec_wg(caps: &Caps) -> u32 {
    caps.subgroup_max.clamp(64, 256).next_power_of_two()
}

/// Whether the mat-vec reads `ty` in units of 16 values (`deq16` in
/// shaders/quant.wgsl: the block's scales decoded once per 16 values and its
/// bytes read 16 at a time) rather than 4. These are the formats of most
/// expert, attention and output weights; each value is the one `deq4` gives.
pub(super) fn matvec_wide(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, Q4_0 | Q8_0 | IQ4_NL | MXFP4 | Q4_K | Q5_K | Q6_K)
}

/// Whether the wide mat-vec of `ty` reads its 16-byte runs as one
/// `vec4<u32>` (W_VEC4, the weight bound a second time as 16-byte words):
/// only where every run starts 16-aligned, i.e. blocks of a multiple of 16
/// bytes with their runs at multiples of 16 (Q4_K: qs at 16; Q5_K: qh at
/// 16, qs at 48). Q8_0 (34 bytes), Q6_K (210) and the 32-value formats
/// (17, 18 bytes) take the word loads.
pub(super) fn matvec_vec4(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K)
}

/// Workgroup size of the split-KV decode attention: as [`matvec_wg`].
pub(super) fn decode_wg(caps: &Caps) -> usize {
    (caps.subgroup_max.max(1) as usize)
        .next_power_of_two()
        .clamp(64, 256)
}

/// The smallest subgroup the decode attention's reduction may meet, as a
/// power of two no larger than its workgroup.
pub(super) fn decode_sg_min(caps: &Caps, wg: usize) -> u32 {
    caps.subgroup_min.max(1).next_power_of_two().min(wg as u32)
}

/// Whether the prompt attention holds its K/V tiles in f16: only with
/// `shader-f16` and an f16 cache.
pub(super) fn prompt_tile_f16(caps: &Caps, kv_f16: bool) -> bool {
    caps.f16 && kv_f16
}

/// The names `#if` sees in every kernel's source: `F16` with `shader-f16`,
/// `SUBGROUPS` with subgroup operations (reductions through workgroup
/// memory otherwise).
pub(super) fn defined(caps: &Caps, name: &str) -> bool {
    match name {
        "F16" => caps.f16,
        "SUBGROUPS" => caps.subgroups,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(f16: bool, subgroups: bool, sg: (u32, u32)) -> Caps {
        Caps {
            f16,
            subgroups,
            subgroup_min: sg.0,
            subgroup_max: sg.1,
            max_binding: 128 << 20,
            max_workgroups_per_dim: 65535,
            poison: false,
        }
    }

    #[test]
    fn workgroups_hold_the_largest_subgroup() {
        // lavapipe (8), Apple (32), NVIDIA (32), AMD (32..64), Intel (8..32),
        // a made-up 128 and a made-up 4.
        for (sg, mv, dec) in [
            ((8, 8), 64, 64),
            ((32, 32), 64, 64),
            ((32, 64), 64, 64),
            ((8, 32), 64, 64),
            ((128, 128), 128, 128),
            ((4, 4), 64, 64),
            ((0, 0), 64, 64),
        ] {
            let c = caps(true, true, sg);
            assert_eq!(matvec_wg(&c), mv, "{sg:?}");
            assert_eq!(decode_wg(&c), dec, "{sg:?}");
            assert!(matvec_wg(&c) >= c.subgroup_max && matvec_wg(&c).is_power_of_two());
            assert!(decode_sg_min(&c, dec) <= dec as u32);
        }
        // A subgroup range that is not a power of two rounds up.
        assert_eq!(decode_sg_min(&caps(true, true, (24, 48)), 64), 32);
    }

    #[test]
    fn vec4_loads_only_where_every_run_is_16_aligned() {
        use GgmlType::*;
        for ty in [
            F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL,
            IQ4_XS, MXFP4, IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, NVFP4,
        ] {
            if matvec_wide(ty) {
                assert_eq!(
                    ty.block_size() % 16,
                    0,
                    "{ty:?}: a unit of 16 within a block"
                );
            }
            if matvec_vec4(ty) {
                assert!(matvec_wide(ty), "{ty:?}");
                assert_eq!(ty.type_size() % 16, 0, "{ty:?}: blocks of 16-byte words");
            }
        }
        assert!(!matvec_vec4(Q8_0) && !matvec_vec4(Q6_K) && !matvec_vec4(F32));
    }

    #[test]
    fn f16_and_subgroup_paths_follow_the_adapter() {
        for (f16, sub) in [(true, true), (true, false), (false, true), (false, false)] {
            let c = caps(f16, sub, (32, 32));
            assert_eq!(defined(&c, "F16"), f16);
            assert_eq!(defined(&c, "SUBGROUPS"), sub);
            assert!(
                !defined(&c, "MUL_MAT_ID"),
                "kernel constants are not adapter names"
            );
            assert_eq!(prompt_tile_f16(&c, true), f16);
            assert!(!prompt_tile_f16(&c, false), "an f32 cache keeps f32 tiles");
        }
    }
}
