#!/usr/bin/env python3
"""Upcycle a dense `llama` GGUF (SmolLM2) into a Mixtral-shaped MoE: every
layer's FFN becomes N identical routed experts (the dense weights' bytes,
copied, in their own quantisation) behind a seeded random router, top-K with
the weights renormalised (llama.cpp's `llama` MoE path). The experts being
equal and the weights summing to one, the MoE says what the dense model says
(to float rounding), so it is a trained model whose experts stream: what
issue 16's speculative-decoding benchmark needs, a model that repeats a
repetitive prompt, where every MoE file offline has random weights.

Its router is random: the experts a token picks follow the hidden state
through a random projection, not a trained one, so the cache sees routing
unlike a trained MoE's (report the hit rate with any figure).

usage: PYTHONPATH=$LLAMA_CPP/gguf-py python tools/upcycle_moe.py IN.gguf OUT.gguf [N_EXPERT [N_USED]]
(needs numpy; defaults 8 experts, 2 used, as Mixtral)
"""
import sys

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from mtp_gguf import copy_metadata, write

SEED = 1607


def main():
    src, dst = sys.argv[1:3]
    n_expert = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    n_used = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    rng = np.random.default_rng(SEED)
    r = GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    assert arch == "llama", f"{src}: {arch}, not a dense llama file"
    assert f"{arch}.expert_count" not in r.fields, f"{src} is already an MoE"
    n_embd = r.fields[f"{arch}.embedding_length"].contents()
    w = GGUFWriter(dst, arch)

    def edit(name, value):
        if name == "general.name":
            return f"{value} upcycled {n_expert}x top-{n_used} (random router)"
        return value

    copy_metadata(r, w, edit)
    w.add_key_value(f"{arch}.expert_count", n_expert, GGUFValueType.UINT32)
    w.add_key_value(f"{arch}.expert_used_count", n_used, GGUFValueType.UINT32)
    dense = {"ffn_gate": "ffn_gate_exps", "ffn_up": "ffn_up_exps", "ffn_down": "ffn_down_exps"}
    for t in r.tensors:
        parts = t.name.split(".")
        if len(parts) == 4 and parts[0] == "blk" and parts[2] in dense:
            # [rows, row bytes] -> [n_expert, rows, row bytes]: ggml's
            # [cols, rows, n_expert], each expert's rows contiguous.
            data = np.ascontiguousarray(np.broadcast_to(t.data, (n_expert, *t.data.shape)))
            name = f"blk.{parts[1]}.{dense[parts[2]]}.weight"
            w.add_tensor(name, data, raw_dtype=t.tensor_type)
            if parts[2] == "ffn_gate":
                # The router: [n_embd, n_expert] in ggml's order, f32.
                gate = rng.normal(0.0, n_embd ** -0.5, (n_expert, n_embd)).astype(np.float32)
                w.add_tensor(f"blk.{parts[1]}.ffn_gate_inp.weight", gate)
        else:
            w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    write(w)


if __name__ == "__main__":
    main()
