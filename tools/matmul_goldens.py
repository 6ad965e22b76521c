#!/usr/bin/env python3
"""llama.cpp's own MUL_MAT / MUL_MAT_ID results on the iqmoe fixtures, for
tests/quant_formats.rs `cpu_matmuls_equal_llamacpp_bit_for_bit`.

Runs tools/llama_dump.cpp (llama.cpp's settings of tools/llama_logits.cpp:
one batch, flash attention off, F32 cache, no repack, CPU) on the longest
golden prompt of each fixture below and keeps, from layer 0, the inputs and
outputs of: the Q projection (Q4_K: ggml's tiled path at 8+ rows), the F32
router (tinyBLAS), and the expert gate and down products (MUL_MAT_ID: experts
with fewer than 8 rows take vec_dot, the others the tiled path), with the
expert ids llama.cpp chose (top-k of its router probabilities).

usage: tools/matmul_goldens.py LLAMA_DUMP_BINARY  (writes
tests/goldens/quant/ggml_matmuls.json). Build the binary as tools/llama_dump.cpp says.
"""
import base64
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
STEMS = ["iqmoe-iq2_xxs", "iqmoe-iq1_m"]
N_USED = 2


def b64(a):
    return base64.b64encode(np.ascontiguousarray(a, dtype="<f4").tobytes()).decode()


def main():
    dump = sys.argv[1]
    cases = []
    for stem in STEMS:
        g = json.loads((ROOT / "tests/goldens" / f"{stem}.json").read_text())
        tokens = max((p["tokens"] for p in g["prompts"]), key=len)
        with tempfile.TemporaryDirectory() as d:
            subprocess.run([dump, str(ROOT / "tests/fixtures" / f"{stem}.gguf"), d, "0",
                            "--tokens", ",".join(map(str, tokens))],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            t = {}
            for line in (Path(d) / "index.tsv").read_text().splitlines():
                f, name, op, *ne = line.split("\t")
                if (name, op) not in t:
                    t[(name, op)] = np.fromfile(Path(d) / f, dtype="<f4")
            probs = t[("ffn_moe_probs-0", "SOFT_MAX")].reshape(len(tokens), -1)
            ids = np.argsort(-probs, axis=1, kind="stable")[:, :N_USED]
            srt = -np.sort(-probs, axis=1)
            assert (srt[:, N_USED - 1] > srt[:, N_USED]).all(), "tied router probabilities"
            counts = np.bincount(ids.ravel(), minlength=probs.shape[1]).tolist()
            cases.append({
                "fixture": f"{stem}.gguf",
                "tokens": len(tokens),
                "ids": ids.ravel().tolist(),
                "n_used": N_USED,
                "rows_per_expert": counts,
                "products": [
                    {"op": "matmul", "weight": "blk.0.attn_q.weight",
                     "x": b64(t[("attn_norm-0", "MUL")]), "y": b64(t[("Qcur-0", "MUL_MAT")])},
                    {"op": "matmul", "weight": "blk.0.ffn_gate_inp.weight",
                     "x": b64(t[("ffn_norm-0", "MUL")]), "y": b64(t[("ffn_moe_logits-0", "MUL_MAT")])},
                    {"op": "mul_mat_id", "weight": "blk.0.ffn_gate_exps.weight", "x_per_tok": 1,
                     "x": b64(t[("ffn_norm-0", "MUL")]), "y": b64(t[("ffn_moe_gate-0", "MUL_MAT_ID")])},
                    {"op": "mul_mat_id", "weight": "blk.0.ffn_down_exps.weight", "x_per_tok": N_USED,
                     "x": b64(t[("ffn_moe_swiglu-0", "SWIGLU")]), "y": b64(t[("ffn_moe_down-0", "MUL_MAT_ID")])},
                ],
            })
    out = ROOT / "tests/goldens/quant/ggml_matmuls.json"
    out.write_text(json.dumps({
        "source": "tools/matmul_goldens.py: llama.cpp's intermediates (tools/llama_dump.cpp, "
                  "exact path, no repack) on the iqmoe fixtures, layer 0",
        "cases": cases}, indent=1) + "\n")
    print(out, out.stat().st_size, "bytes;", [c["rows_per_expert"] for c in cases])


if __name__ == "__main__":
    main()
