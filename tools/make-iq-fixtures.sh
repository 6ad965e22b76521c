#!/usr/bin/env bash
# The low-bit-format fixtures and goldens (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S,
# IQ3_XXS, IQ3_S, NVFP4), through tools/make-fixtures.sh (same environment:
# PYTHON, LLAMACPP_DIR, LONGHAUL_MODELS, FIXTURES_WORK):
#   hf, convert   the random `iqmoe` stem (qwen3moe, rows of 256 everywhere): its
#                 transformers golden tests/goldens/iqmoe-f32.json; its f32/f16 GGUFs
#                 go to $FIXTURES_WORK/iq-src (too big to commit)
#   iq            llama-imatrix on the tokenizer corpus -> tests/fixtures/imatrix/iqmoe.imatrix.gguf;
#                 llama-quantize --imatrix ... Q4_K_M with ffn_{gate,up,down}_exps in each
#                 format and token_embd/output Q8_0 -> tests/fixtures/iqmoe-<fmt>.gguf;
#                 llama.cpp goldens tests/goldens/iqmoe-<fmt>.json (exact path: -fa off, F32 KV)
#                 and iqmoe-<fmt>.default.json (llama.cpp's defaults: fa auto, F16 KV)
#   smollm2-iq    SmolLM2-135M-Instruct Q4_1 (tools/fetch-models.sh) re-quantised with an
#                 importance matrix (tests/fixtures/imatrix/smollm2-135m-instruct-q4_1.imatrix.gguf)
#                 to IQ2_XXS, IQ3_XXS, IQ1_M ($LONGHAUL_MODELS/smollm2-135m-instruct-<fmt>.gguf,
#                 not in the repository), goldens tests/goldens/smollm2-<fmt>-greedy.json (exact)
#                 and smollm2-<fmt>-greedy-default.json (defaults)
# Needs llama-imatrix in the llama.cpp build (tools/build-llamacpp.sh builds it).
# Arguments replace the default stage list, e.g. `tools/make-iq-fixtures.sh iq` or
# `tools/make-iq-fixtures.sh --stem iq2_xxs iq`.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${LLAMACPP_DIR:-$HOME/.cache/longhaul/llama.cpp}/build/bin"
[ -x "$bin/llama-imatrix" ] || { echo "$bin/llama-imatrix missing: run tools/build-llamacpp.sh" >&2; exit 1; }
if [ $# -eq 0 ]; then set -- hf convert iq smollm2-iq; fi
exec "$root/tools/make-fixtures.sh" --arch iqmoe "$@"
