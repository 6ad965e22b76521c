#!/usr/bin/env bash
# Regenerate tests/fixtures/*.gguf and tests/goldens/*.json.
#   1. tools/build-llamacpp.sh   (llama.cpp source + build, ~/.cache/longhaul/llama.cpp)
#   2. tools/fetch-models.sh     (SmolLM2 / Gemma 3 GGUFs, for smollm2-greedy.json)
#   3. this script: builds tools/llama_logits.cpp against that build, then runs
#      tools/make_fixtures.py (hf -> convert -> quantize -> llama -> smollm2).
# Env: PYTHON (default /work/ref/venv/bin/python if present, else python3; needs
# torch, transformers, safetensors, sentencepiece, tokenizers, numpy),
# LLAMACPP_DIR, LONGHAUL_MODELS, FIXTURES_WORK (scratch, default
# ~/.cache/longhaul/fixtures-work). Extra arguments go to make_fixtures.py,
# e.g. `tools/make-fixtures.sh --arch gpt-oss hf convert`.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
lc="${LLAMACPP_DIR:-$HOME/.cache/longhaul/llama.cpp}"
src="$lc/src/vendor/llama.cpp"
bin="$lc/build/bin"
work="${FIXTURES_WORK:-$HOME/.cache/longhaul/fixtures-work}"
if [ -z "${PYTHON:-}" ]; then
  if [ -x /work/ref/venv/bin/python ]; then PYTHON=/work/ref/venv/bin/python; else PYTHON=python3; fi
fi
[ -f "$bin/libllama.so" ] && [ -x "$bin/llama-quantize" ] || {
  echo "llama.cpp build not found in $bin; run tools/build-llamacpp.sh first" >&2; exit 1; }
mkdir -p "$work"
g++ -O2 -std=c++17 "$root/tools/llama_logits.cpp" -I"$src/include" -I"$src/ggml/include" \
  -L"$bin" -lllama -lggml -lggml-base -Wl,-rpath,"$bin" -o "$work/llama_logits"
ver="llama.cpp $(git -C "$src" rev-parse --short=12 HEAD 2>/dev/null || echo unknown), llama-cpp-python sdist $(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$lc/src/llama_cpp/__init__.py" 2>/dev/null || echo unknown)"
export PYTHONHASHSEED=0 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=2
# A CUDA build of torch (the PyPI wheel) installed without its nvidia-* wheels
# cannot be imported: give it stub CUDA libraries (tools/torch_cuda_stubs.py),
# it then runs on the CPU.
if ! "$PYTHON" -c "import torch" >/dev/null 2>&1; then
  tlib="$("$PYTHON" -c "import importlib.util, os; print(os.path.join(os.path.dirname(importlib.util.find_spec('torch').origin), 'lib'))")"
  python3 "$root/tools/torch_cuda_stubs.py" "$tlib" "$work/cuda-stubs" >/dev/null
  export LD_LIBRARY_PATH="$work/cuda-stubs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  "$PYTHON" -c "import torch" || { echo "torch does not import, even with CUDA stubs" >&2; exit 1; }
fi
exec "$PYTHON" "$root/tools/make_fixtures.py" --work "$work" --llama-src "$src" --bin "$bin" \
  --llama-logits "$work/llama_logits" --llama-version "$ver" \
  --models "${LONGHAUL_MODELS:-$HOME/.cache/longhaul/models}" "$@"
