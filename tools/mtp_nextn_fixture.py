#!/usr/bin/env python3
"""Give a fixture without NextN layers one NextN/MTP layer, as
convert_hf_to_gguf.py writes DeepSeek-V3's (`blk.{n}.nextn.*` after the
trunk, `nextn_predict_layers` 1, `block_count` + 1), for tests/mtp.rs:
transformers builds no MTP weights, so tools/make_fixtures.py leaves the
DeepSeek-V3 fixture without them.

The new layer is the trunk's last attention layer (the last without a
recurrent `ssm_*` tensor: a hybrid's MTP layer is full attention) with every
weight multiplied by
U(0.5, 1.5) noise (so it is a decoder layer of the right kind and scale, but
not a copy), plus eh_proj ~ N(0, 0.02) and enorm, hnorm and shared_head_norm
~ U(0.5, 1.5), all from one seeded generator.

usage: PYTHONPATH=$LLAMA_CPP/gguf-py python tools/mtp_nextn_fixture.py IN.gguf OUT.gguf
(needs numpy; the gguf-py of llama.cpp's source tree, tools/build-llamacpp.sh)
"""
import sys

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from mtp_gguf import copy_metadata, write

SEED = 1607


def main():
    src, dst = sys.argv[1:3]
    rng = np.random.default_rng(SEED)
    r = GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    n_layer = r.fields[f"{arch}.block_count"].contents()
    assert f"{arch}.nextn_predict_layers" not in r.fields, "the file has NextN layers already"
    w = GGUFWriter(dst, arch)

    def edit(name, value):
        if name == "general.name":
            return value + "-mtp"
        if name == f"{arch}.block_count":
            return n_layer + 1
        if name == f"{arch}.attention.recurrent_layers":
            return list(value) + [False]
        return value

    copy_metadata(r, w, edit)
    w.add_key_value(f"{arch}.nextn_predict_layers", 1, GGUFValueType.UINT32)
    with_ssm = {t.name.split(".")[1] for t in r.tensors if ".ssm_" in t.name}
    src_layer = max(il for il in range(n_layer) if str(il) not in with_ssm)
    last = f"blk.{src_layer}."
    e = r.fields[f"{arch}.embedding_length"].contents()
    extra = []
    for t in r.tensors:
        assert t.tensor_type.name == "F32", t.name
        a = np.array(t.data, dtype=np.float32)
        w.add_tensor(t.name, np.ascontiguousarray(a))
        if t.name.startswith(last):
            noise = rng.uniform(0.5, 1.5, a.shape).astype(np.float32)
            extra.append((f"blk.{n_layer}." + t.name[len(last):], a * noise))
    extra.append((f"blk.{n_layer}.nextn.eh_proj.weight",
                  (rng.standard_normal((e, 2 * e)) * 0.02).astype(np.float32)))
    for k in ("enorm", "hnorm", "shared_head_norm"):
        extra.append((f"blk.{n_layer}.nextn.{k}.weight", rng.uniform(0.5, 1.5, e).astype(np.float32)))
    for name, a in extra:
        w.add_tensor(name, np.ascontiguousarray(a))
    write(w)


if __name__ == "__main__":
    main()
