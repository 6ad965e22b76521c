#!/usr/bin/env python3
"""Derive a GLM-4.5-shaped fixture whose MTP head agrees with its trunk part
of the time, from tests/fixtures/glm4moe-f32.gguf (tools/make_fixtures.py):
a random head never predicts what the trunk samples, so llama.cpp and
longhaul accept none of its drafts and the accept path goes untested.

Every block's output projection (attn_output, ffn_down, ffn_down_exps,
ffn_down_shexp, in the trunk and in the NextN layer) is scaled by SCALE, so
the residual stream stays close to the token's embedding and the trunk's next
token is mostly a function of the current one: argmax(output . norm(embed(x))).
The head computes nearly the same function of the token it is given:
eh_proj = [I | H_SCALE * R] keeps the normed embedding and a share of the
file's random weights R for the trunk row, enorm is 1, and shared_head_norm is
output_norm; the head's own blocks are scaled by HEAD_SCALE. Drafts then agree with the trunk
except where the context (attention, routed experts) moves its argmax.

usage: PYTHONPATH=$LLAMA_CPP/gguf-py python tools/mtp_agree_fixture.py IN.gguf OUT.gguf
(needs numpy; the gguf-py of llama.cpp's source tree, tools/build-llamacpp.sh)
"""
import os
import sys

import numpy as np
from gguf import GGUFReader, GGUFWriter
from mtp_gguf import copy_metadata, write

SCALE = float(os.environ.get("MTP_AGREE_SCALE", "0.003"))
# The head's own blocks keep more weight, so that its attention over the
# positions it caught up on moves its probabilities measurably.
HEAD_SCALE = float(os.environ.get("MTP_AGREE_HEAD_SCALE", "0.03"))
H_SCALE = float(os.environ.get("MTP_AGREE_H_SCALE", "0.1"))
OUT_PROJ = ("attn_output.weight", "ffn_down.weight", "ffn_down_exps.weight", "ffn_down_shexp.weight")


def main():
    src, dst = sys.argv[1:3]
    r = GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = GGUFWriter(dst, arch)
    def edit(name, value):
        return value + "-mtp-agree" if name == "general.name" else value

    copy_metadata(r, w, edit)
    tensors = {t.name: t for t in r.tensors}
    n_layer = r.fields[f"{arch}.block_count"].contents() - r.fields[f"{arch}.nextn_predict_layers"].contents()
    out_norm = np.array(tensors["output_norm.weight"].data, dtype=np.float32)
    for t in r.tensors:
        assert t.tensor_type.name == "F32", t.name
        a = np.array(t.data, dtype=np.float32)
        if t.name.endswith(OUT_PROJ):
            head = t.name.startswith(f"blk.{n_layer}.")
            a = a * np.float32(HEAD_SCALE if head else SCALE)
        if t.name == f"blk.{n_layer}.nextn.eh_proj.weight":
            e = a.shape[0]
            assert a.shape == (e, 2 * e), a.shape
            # The trunk row keeps a share of its random weights, so that
            # what the head is paired with still moves its output.
            h_part = a[:, e:] * np.float32(H_SCALE)
            a = np.concatenate([np.eye(e, dtype=np.float32), h_part], axis=1)
        if t.name == f"blk.{n_layer}.nextn.enorm.weight":
            a = np.ones_like(a)
        if t.name == f"blk.{n_layer}.nextn.shared_head_norm.weight":
            a = out_norm.copy()
        w.add_tensor(t.name, np.ascontiguousarray(a))
    write(w)


if __name__ == "__main__":
    main()
