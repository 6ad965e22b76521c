//! The Unsupported errors: their advice per backend, and the trait's
//! defaults for ops a backend lacks.

use super::cpu::CpuBackend;
use super::*;

#[test]
fn cpu_unsupported_messages_do_not_send_the_user_to_the_cpu() {
    let cpu = CpuBackend::new();
    // A dtype the CPU lacks: another quantisation, never -ngl 0.
    let e = BackendError::Unsupported {
        op: "matmul",
        backend: cpu.name(),
        dtype: GgmlType::IQ1_M,
    }
    .to_string();
    assert!(e.contains("CPU backend does not support matmul on"), "{e}");
    assert!(
        e.contains("another quantisation") && e.contains("re-convert"),
        "{e}"
    );
    assert!(!e.contains("--n-gpu-layers"), "{e}");
    // A KV cache type the CPU lacks, raised by the CPU itself.
    let e = cpu
        .new_kv(16, 8, 8, GgmlType::Q4_0)
        .err()
        .expect("a q4_0 cache is unsupported");
    assert!(
        matches!(e, BackendError::Unsupported { backend, .. } if backend.eq_ignore_ascii_case("cpu"))
    );
    let e = e.to_string();
    assert!(
        e.contains("--cache-type-k") && !e.contains("--n-gpu-layers"),
        "{e}"
    );
    // An op the CPU lacks (what the trait's defaults return).
    let e = cpu.unsupported_op("mla_attention");
    assert!(matches!(
        e,
        BackendError::UnsupportedOp {
            op: "mla_attention",
            backend: "CPU"
        }
    ));
    let e = e.to_string();
    assert!(
        e.contains("CPU backend does not implement mla_attention"),
        "{e}"
    );
    assert!(!e.contains("--n-gpu-layers"), "{e}");
}

/// A backend with only the required ops (the CPU's): what a new
/// placement looks like before it implements the optional ones.
#[derive(Clone)]
struct Bare(CpuBackend);

type T = cpu::CpuTensor;
type W = cpu::CpuWeight;
type R<X> = Result<X, BackendError>;

impl Backend for Bare {
    type Tensor = T;
    type Weight = W;
    type Kv = cpu::CpuKv;
    type Slots = cpu::HostSlots;
    fn name(&self) -> &'static str {
        "bare"
    }
    fn load_weight(
        &self,
        m: &std::sync::Arc<crate::gguf::Model>,
        t: &crate::gguf::TensorInfo,
    ) -> R<W> {
        self.0.load_weight(m, t)
    }
    fn placeholder_weight(&self, t: &crate::gguf::TensorInfo) -> R<W> {
        self.0.placeholder_weight(t)
    }
    fn weight_from_bytes(&self, t: &crate::gguf::TensorInfo, b: Vec<u8>) -> R<W> {
        self.0.weight_from_bytes(t, b)
    }
    fn new_slots(&self, t: &[SlotTensor], n: usize) -> R<Self::Slots> {
        self.0.new_slots(t, n)
    }
    fn slot_weight(&self, s: &Self::Slots, t: usize) -> R<W> {
        self.0.slot_weight(s, t)
    }
    fn gather_rows(&self, x: &T, r: &[usize]) -> R<T> {
        self.0.gather_rows(x, r)
    }
    fn scatter_rows(&self, d: &mut T, s: &T, r: &[usize]) -> R<()> {
        self.0.scatter_rows(d, s, r)
    }
    fn zeros(&self, r: usize, c: usize) -> R<T> {
        self.0.zeros(r, c)
    }
    fn from_host(&self, d: Vec<f32>, r: usize, c: usize) -> R<T> {
        self.0.from_host(d, r, c)
    }
    fn to_host(&self, t: &T) -> R<Vec<f32>> {
        self.0.to_host(t)
    }
    fn shape(&self, t: &T) -> (usize, usize) {
        self.0.shape(t)
    }
    fn get_rows(&self, w: &W, ids: &[u32]) -> R<T> {
        self.0.get_rows(w, ids)
    }
    fn matmul(&self, w: &W, x: &T) -> R<T> {
        self.0.matmul(w, x)
    }
    fn mul_mat_id(&self, w: &W, x: &T, ids: &[u32], n: usize) -> R<T> {
        self.0.mul_mat_id(w, x, ids, n)
    }
    fn add_bias(&self, x: &mut T, b: &W) -> R<()> {
        self.0.add_bias(x, b)
    }
    fn add_bias_id(&self, x: &mut T, b: &W, ids: &[u32]) -> R<()> {
        self.0.add_bias_id(x, b, ids)
    }
    fn add(&self, a: &mut T, b: &T) -> R<()> {
        self.0.add(a, b)
    }
    fn scale_rows(&self, x: &mut T, s: &[f32]) -> R<()> {
        self.0.scale_rows(x, s)
    }
    fn rms_norm(&self, x: &T, w: &W, g: usize, eps: f32) -> R<T> {
        self.0.rms_norm(x, w, g, eps)
    }
    fn rope(&self, x: &mut T, hd: usize, pos: BatchPos, p: &RopeParams) -> R<()> {
        self.0.rope(x, hd, pos, p)
    }
    fn glu(&self, g: &T, u: &T, k: Glu) -> R<T> {
        self.0.glu(g, u, k)
    }
    fn weighted_sum(&self, x: &T, w: &[f32], n: usize) -> R<T> {
        self.0.weighted_sum(x, w, n)
    }
    fn new_kv(&self, n: usize, k: usize, v: usize, d: GgmlType) -> R<Self::Kv> {
        self.0.new_kv(n, k, v, d)
    }
    fn kv_shape(&self, kv: &Self::Kv) -> (super::KvShape, GgmlType) {
        self.0.kv_shape(kv)
    }
    fn kv_read(&self, kv: &Self::Kv, n: usize) -> R<Vec<u8>> {
        self.0.kv_read(kv, n)
    }
    fn kv_write(&self, kv: &mut Self::Kv, n: usize, bytes: &[u8]) -> R<()> {
        self.0.kv_write(kv, n, bytes)
    }
    fn attention(
        &self,
        kv: &mut Self::Kv,
        q: &T,
        k: &T,
        v: &T,
        s: Option<&W>,
        pos: BatchPos,
        p: &AttnParams,
    ) -> R<T> {
        self.0.attention(kv, q, k, v, s, pos, p)
    }
}

#[test]
fn ops_a_backend_lacks_default_to_unsupported_op() {
    let b = Bare(CpuBackend::new());
    let x = || b.from_host(vec![1.0; 8], 2, 4).unwrap();
    let results = [
        ("reshape", b.reshape(x(), 4, 2).map(drop)),
        ("split_cols", b.split_cols(&x(), 2, 0, 1).map(drop)),
        ("concat_cols", b.concat_cols(&x(), 2, &x(), 2).map(drop)),
        ("mul_act", b.mul_act(&mut x(), &x(), Act::Sigmoid)),
    ];
    for (op, r) in results {
        match r {
            Err(BackendError::UnsupportedOp {
                op: o,
                backend: "bare",
            }) if o == op => {}
            other => panic!("{op}: {other:?}"),
        }
    }
}

#[test]
fn gpu_unsupported_messages_point_to_the_cpu() {
    for backend in ["gpu", "GPU"] {
        let e = BackendError::Unsupported {
            op: "matmul",
            backend,
            dtype: GgmlType::IQ1_M,
        }
        .to_string();
        assert!(e.contains("use --n-gpu-layers 0 to run on the CPU"), "{e}");
        let e = BackendError::UnsupportedOp { op: "x", backend }.to_string();
        assert!(e.contains("use --n-gpu-layers 0 to run on the CPU"), "{e}");
    }
}
