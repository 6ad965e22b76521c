//! GPU expert slots: bytes written through mapped staging buffers land in
//! the right slot of the right part, across several fills that reuse the
//! staging ring, with slots split over several bindings.

mod gpu_util;

use gpu_util::options;
use longhaul::backend::gpu::GpuBackend;
use longhaul::backend::{Backend, SlotStore, SlotTensor};
use longhaul::tensor::GgmlType;

fn pattern(t: usize, s: usize, fill: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i * 31 + t * 7 + s * 13 + fill * 101) as u8)
        .collect()
}

#[test]
fn staged_writes_land_in_their_slots() {
    let mut o = options();
    o.max_binding = Some(64 * 1024);
    let g = GpuBackend::open(&o).expect("open");
    // Q8_0 [64, 120] = 8160 bytes per expert, and an odd-sized f32 bias.
    let tensors = vec![
        SlotTensor {
            ty: GgmlType::Q8_0,
            dims: vec![64, 240],
            bytes: 2 * 34 * 240,
            // The GPU store keeps GGUF bytes whatever this says.
            repack: true,
        },
        SlotTensor {
            ty: GgmlType::F32,
            dims: vec![33],
            bytes: 33 * 4,
            repack: true,
        },
    ];
    let n_slots = 12;
    let mut slots = g.new_slots(&tensors, n_slots).unwrap();
    let w0 = g.slot_weight(&slots, 0).unwrap();
    assert!(w0.parts.len() > 1, "64 KiB bindings must split the slots");
    assert_eq!(w0.ne, [64, 240, n_slots]);
    drop(w0);
    let mut expect = vec![vec![None::<Vec<u8>>; n_slots]; tensors.len()];
    for fill in 0..5 {
        let which: Vec<(usize, usize)> = (0..4)
            .flat_map(|k| {
                let s = (fill * 5 + k * 3) % n_slots;
                (0..tensors.len()).map(move |t| (t, s))
            })
            .collect();
        let dsts = slots.slots_mut(&which).unwrap();
        for (dst, &(t, s)) in dsts.into_iter().zip(&which) {
            let p = pattern(t, s, fill, dst.len());
            dst.copy_from_slice(&p);
            expect[t][s] = Some(p);
        }
        slots.commit().unwrap();
    }
    for (t, spec) in tensors.iter().enumerate() {
        let w = g.slot_weight(&slots, t).unwrap();
        for (s, want) in expect[t].iter().enumerate() {
            let Some(want) = want else { continue };
            let (part, local) = w.part_of(s).unwrap();
            let got = g
                .ctx()
                .read(&part.buf, local as u64 * w.expert_stride, spec.bytes)
                .unwrap();
            assert_eq!(&got, want, "tensor {t} slot {s}");
        }
    }
    assert!(slots.slots_mut(&[(0, n_slots)]).is_err());
    assert!(slots.slots_mut(&[(0, 1), (0, 1)]).is_err());
}
