#!/usr/bin/env python3
"""Regenerates tests/goldens/quant/<type>.json from the `gguf` Python package.

For every weight type longhaul supports it writes deterministic cases:
  - "random": seeded random block bytes with sane scale fields (finite,
    modest f16 scales / E8M0 exponents), dequantised by gguf.quants.dequantize;
  - "quantized" (types gguf.quants can quantise): seeded normal f32 input,
    the bytes of gguf.quants.quantize and their dequantisation.
Arrays are stored as little-endian hex ("bytes", f32 "input"/"dequant") to
keep the files small (< 100 KB in all).

With --libggml DIR (a llama.cpp build's directory holding libggml-base.so)
it also writes "quantized" cases for Q4_K and Q6_K from ggml's own
quantize_row_q4_K_ref / quantize_row_q6_K_ref, and activation goldens
act_q8_1.json / act_q8_k.json from quantize_row_q8_1_ref / _q8_K_ref.

With --fixtures it writes only fixture_dequant.json (see fixture_dequant_goldens).

Run: /work/ref/venv/bin/python tools/quant_goldens.py [--libggml DIR | --fixtures]
"""
import ctypes
import json
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "goldens", "quant")

# type -> (elements per random case, {f16 scale field byte offsets}, e8m0 offset)
RANDOM = {
    T.F32: (64, [], None),
    T.F16: (64, [], None),
    T.BF16: (64, [], None),
    T.Q4_0: (128, [0], None),
    T.Q4_1: (128, [0, 2], None),
    T.Q5_0: (128, [0], None),
    T.Q5_1: (128, [0, 2], None),
    T.Q8_0: (128, [0], None),
    T.Q2_K: (512, [80, 82], None),
    T.Q3_K: (512, [108], None),
    T.Q4_K: (512, [0, 2], None),
    T.Q5_K: (512, [0, 2], None),
    T.Q6_K: (512, [208], None),
    T.IQ4_NL: (128, [0], None),
    T.IQ4_XS: (512, [0], None),
    T.MXFP4: (128, [], 0),
    T.IQ2_XXS: (512, [0], None),
    T.IQ2_XS: (512, [0], None),
    T.IQ2_S: (512, [0], None),
    T.IQ3_XXS: (512, [0], None),
    T.IQ3_S: (512, [0], None),
    T.IQ1_S: (512, [0], None),
    T.IQ1_M: (512, [], None),  # its f16 scale is spread over nibbles: see random_bytes
    T.NVFP4: (256, [], None),  # UE4M3 scales: see random_bytes
}
# The low-bit formats of issue 14: goldens also hold blocks of ggml's own
# quantiser (ggml_quantize_chunk, what llama-quantize calls, with an
# importance matrix) and ggml's CPU dot products on them (dot_<type>.json).
# MXFP4 last, so the seeds (by position) of the others stay as they were.
LOW_BIT = [T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M, T.NVFP4, T.MXFP4]
QUANTIZABLE = {T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.MXFP4}


def hexf32(a):
    return np.ascontiguousarray(a, dtype="<f4").tobytes().hex()


def random_bytes(rng, ty, n, scale_offs, e_off):
    bs, ts = quants.GGML_QUANT_SIZES[ty]
    nb = n // bs
    if ty == T.F32:
        return rng.standard_normal(n).astype("<f4").view(np.uint8).reshape(nb, ts)
    if ty == T.F16:
        return rng.standard_normal(n).astype("<f2").view(np.uint8).reshape(nb, ts)
    if ty == T.BF16:
        x = rng.standard_normal(n).astype("<f4").view("<u4") >> 16
        return x.astype("<u2").view(np.uint8).reshape(nb, ts)
    raw = rng.integers(0, 256, size=(nb, ts), dtype=np.uint8)
    for off in scale_offs:
        sign = np.where(rng.random(nb) < 0.2, -1.0, 1.0)
        d = (sign * rng.uniform(0.001, 0.05, nb)).astype("<f2")
        raw[:, off:off + 2] = d.view(np.uint8).reshape(nb, 2)
    if e_off is not None:
        raw[:, e_off] = rng.integers(115, 135, nb, dtype=np.uint8)
    if ty == T.IQ1_M:
        # scales: 4 little-endian u16 at 48; the top nibble of each holds 4 bits
        # of the super-block's f16 scale (word 0 the lowest).
        d = rng.uniform(0.001, 0.05, nb).astype("<f2").view("<u2")
        for w in range(4):
            nib = (d >> (4 * w)) & 0xF
            raw[:, 48 + 2 * w + 1] = (raw[:, 48 + 2 * w + 1] & 0x0F) | (nib << 4).astype(np.uint8)
    if ty == T.NVFP4:
        # four UE4M3 sub-block scales per block, modest exponents (and a zero).
        raw[:, 0:4] = rng.integers(0x18, 0x48, (nb, 4), dtype=np.uint8)
        raw[0, 1] = 0
    return raw


def ggml_ref(lib, fn, x, out_bytes):
    """Calls ggml's `void fn(const float *, void *, int64_t k)`."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.zeros(out_bytes, dtype=np.uint8)
    f = getattr(lib, fn)
    f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    f.restype = None
    f(x.ctypes.data, out.ctypes.data, x.size)
    return out


def ggml_cases(libdir):
    lib = ctypes.CDLL(os.path.join(libdir, "libggml-base.so"))
    rng = np.random.default_rng(99)
    extra, acts = {}, {}
    for ty, fn in ((T.Q4_K, "quantize_row_q4_K_ref"), (T.Q6_K, "quantize_row_q6_K_ref")):
        x = (rng.standard_normal(512) * rng.uniform(0.1, 3.0)).astype(np.float32)
        x[300:316] = 0.0  # an all-zero sub-block
        q = ggml_ref(lib, fn, x, 2 * quants.GGML_QUANT_SIZES[ty][1])
        extra[ty] = {"name": "quantized", "n": 512, "input": hexf32(x), "bytes": q.tobytes().hex(),
                     "dequant": hexf32(quants.dequantize(q, ty)), "source": f"libggml-base {fn}"}
    for name, fn, ts, bs in (("q8_1", "quantize_row_q8_1_ref", 36, 32), ("q8_K", "quantize_row_q8_K_ref", 292, 256)):
        x = (rng.standard_normal(512) * 1.7).astype(np.float32)
        x[:bs] = 0.0 if name == "q8_K" else x[:bs]  # Q8_K: an all-zero block
        q = ggml_ref(lib, fn, x, 512 // bs * ts)
        acts[name] = {"type": name, "source": f"libggml-base {fn}", "n": 512, "input": hexf32(x), "bytes": q.tobytes().hex()}
    return extra, acts


class TypeTraitsCpu(ctypes.Structure):
    _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p),
                ("vec_dot_type", ctypes.c_int), ("nrows", ctypes.c_int64)]


VEC_DOT = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.POINTER(ctypes.c_float), ctypes.c_size_t,
                           ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                           ctypes.c_int)
FROM_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


def low_bit_cases(libdir):
    """ggml_quantize_chunk blocks (with an importance matrix) for LOW_BIT types and
    ggml's CPU vec_dot on quantised and random blocks against its own activation
    quantiser. Returns ({type: dequant case}, {type: dot doc})."""
    base = ctypes.CDLL(os.path.join(libdir, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(os.path.join(libdir, "libggml-cpu.so"))
    cpu.ggml_cpu_init.restype = None
    cpu.ggml_cpu_init()
    cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(TypeTraitsCpu)
    cpu.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]
    base.ggml_quantize_chunk.restype = ctypes.c_size_t
    base.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                         ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    deq, dots = {}, {}
    for i, ty in enumerate(LOW_BIT):
        rng = np.random.default_rng(4321 + i)
        bs, ts = quants.GGML_QUANT_SIZES[ty]
        # 32-weight blocks: an odd block count, so the dot's tail after the
        # block pairs is covered too.
        n, rows = (512 if bs == 256 or ty == T.NVFP4 else 544), 3
        x = (rng.standard_normal((rows, n)) * rng.uniform(0.1, 3.0)).astype(np.float32)
        x[1, 64:96] = 0.0  # an all-zero run
        imat = rng.uniform(0.1, 4.0, n).astype(np.float32)
        q = np.zeros(rows * n // bs * ts, dtype=np.uint8)
        got = base.ggml_quantize_chunk(int(ty), x.ctypes.data, q.ctypes.data, 0, rows, n, imat.ctypes.data)
        assert got == q.size, (ty, got, q.size)
        deq[ty] = {"name": "quantized", "n": rows * n, "input": hexf32(x), "bytes": q.tobytes().hex(),
                   "dequant": hexf32(quants.dequantize(q, ty)),
                   "source": "libggml-base ggml_quantize_chunk with a random importance matrix"}
        tr = cpu.ggml_get_type_traits_cpu(int(ty)).contents
        at = tr.vec_dot_type
        abs_, ats = quants.GGML_QUANT_SIZES[T(at)]
        act_from = FROM_FLOAT(cpu.ggml_get_type_traits_cpu(at).contents.from_float)
        dot = VEC_DOT(tr.vec_dot)
        rand = random_bytes(rng, ty, rows * n, *RANDOM[ty][1:]).reshape(-1)
        cases = []
        for kind, wbytes in (("quantized", q), ("random", np.ascontiguousarray(rand))):
            for r in range(rows):
                w = np.ascontiguousarray(wbytes[r * (n // bs * ts):(r + 1) * (n // bs * ts)])
                y = (rng.standard_normal(n) * rng.uniform(0.2, 2.0)).astype(np.float32)
                a = np.zeros(n // abs_ * ats, dtype=np.uint8)
                act_from(y.ctypes.data, a.ctypes.data, n)
                out = ctypes.c_float(0.0)
                dot(n, ctypes.byref(out), 0, w.ctypes.data, 0, a.ctypes.data, 0, 1)
                cases.append({"name": f"{kind} row {r}", "n": n, "weights": w.tobytes().hex(),
                              "act": a.tobytes().hex(),
                              "dot": np.array([out.value], dtype="<f4").tobytes().hex()})
        dots[ty] = {"type": ty.name, "act_type": T(at).name,
                    "source": "libggml-cpu ggml_get_type_traits_cpu(type)->vec_dot and the activation "
                              "type's from_float (ggml's x86 build, GGML_NATIVE)", "cases": cases}
    return deq, dots


def main():
    os.makedirs(OUT, exist_ok=True)
    total = 0
    extra, acts = {}, {}
    if "--libggml" in sys.argv:
        libdir = sys.argv[sys.argv.index("--libggml") + 1]
        extra, acts = ggml_cases(libdir)
        low, dots = low_bit_cases(libdir)
        for ty, case in low.items():
            extra[ty] = case
        for ty, doc in dots.items():
            acts[f"dot_{ty.name}"] = doc
        for name, doc in acts.items():
            stem = name.lower() if name.startswith("dot_") else f"act_{name.lower()}"
            path = os.path.join(OUT, f"{stem}.json")
            with open(path, "w") as f:
                json.dump(doc, f, separators=(",", ":"))
                f.write("\n")
            total += os.path.getsize(path)
    for i, (ty, (n, offs, e_off)) in enumerate(RANDOM.items()):
        rng = np.random.default_rng(1234 + i)
        raw = random_bytes(rng, ty, n, offs, e_off)
        deq = quants.dequantize(raw.reshape(-1), ty) if ty not in (T.F32, T.F16, T.BF16) else None
        if ty == T.F32:
            deq = raw.reshape(-1).view("<f4")
        elif ty == T.F16:
            deq = raw.reshape(-1).view("<f2").astype(np.float32)
        elif ty == T.BF16:
            deq = quants.dequantize(raw.reshape(-1), ty)
        cases = [{"name": "random", "n": n, "bytes": raw.tobytes().hex(), "dequant": hexf32(deq)}]
        if ty in QUANTIZABLE:
            x = (rng.standard_normal(128) * rng.uniform(0.1, 3.0)).astype(np.float32)
            x[5] = 0.0
            q = quants.quantize(x, ty)
            dq = quants.dequantize(q, ty)
            cases.append({
                "name": "quantized", "n": 128, "input": hexf32(x),
                "bytes": np.ascontiguousarray(q).view(np.uint8).tobytes().hex(), "dequant": hexf32(dq),
            })
        if ty in extra:
            cases.append(extra[ty])
        doc = {"type": ty.name, "source": "gguf.quants (gguf-py)", "cases": cases}
        path = os.path.join(OUT, f"{ty.name.lower()}.json")
        with open(path, "w") as f:
            json.dump(doc, f, separators=(",", ":"))
            f.write("\n")
        total += os.path.getsize(path)
    print(f"wrote {len(RANDOM)} files, {total} bytes")


if __name__ == "__main__" and "--fixtures" not in sys.argv:
    main()


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def fixture_dequant_goldens():
    """tests/goldens/quant/fixture_dequant.json: gguf-py's dequantisation of the
    routed-expert tensors of the iqmoe fixtures (real llama-quantize output, with
    an importance matrix) as FNV-1a 64 hashes of the f32 bytes, plus the first
    values, so the test needs no megabytes of floats."""
    from gguf import GGUFReader
    fx = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures")
    out = []
    for name in sorted(os.listdir(fx)):
        if not (name.startswith("iqmoe-") and name.endswith(".gguf")):
            continue
        r = GGUFReader(os.path.join(fx, name))
        for t in r.tensors:
            if "_exps." not in t.name:
                continue
            f = quants.dequantize(t.data, t.tensor_type).astype("<f4").reshape(-1)
            b = f.tobytes()
            out.append({"fixture": name, "tensor": t.name, "type": t.tensor_type.name,
                        "n": int(f.size), "fnv1a64": f"{fnv1a64(b):016x}", "first": hexf32(f[:16])})
    path = os.path.join(OUT, "fixture_dequant.json")
    with open(path, "w") as fh:
        json.dump({"source": "gguf.quants.dequantize (gguf-py) of tests/fixtures/iqmoe-*.gguf",
                   "hash": "FNV-1a 64 of the little-endian f32 bytes", "tensors": out}, fh, indent=0)
        fh.write("\n")
    print(f"wrote {path}: {len(out)} tensors")


if __name__ == "__main__" and "--fixtures" in sys.argv:
    fixture_dequant_goldens()
