#!/usr/bin/env bash
# Download llama.cpp's source (vendored in the llama-cpp-python sdist on PyPI)
# and build the reference tools outside the repository.
#   LLAMACPP_DIR (default: ~/.cache/longhaul/llama.cpp) receives source and build.
# Prints the bin directory on its last line.
set -euo pipefail
dir="${LLAMACPP_DIR:-$HOME/.cache/longhaul/llama.cpp}"
mkdir -p "$dir"
cd "$dir"
if [ ! -d src/vendor/llama.cpp ]; then
  rm -rf dl && mkdir dl
  python3 -m pip download --no-binary :all: --no-deps -d dl llama-cpp-python
  mkdir -p src && tar -xzf dl/llama_cpp_python-*.tar.gz -C src --strip-components=1
fi
src="$dir/src/vendor/llama.cpp"
cmake -S "$src" -B build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=ON \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON >/dev/null
cmake --build build -j "$(nproc)" --target llama-cli llama-completion llama-bench llama-server \
  llama-quantize llama-tokenize llama-perplexity llama-gguf-split llama-eval-callback 2>&1 | tail -n 3 || \
cmake --build build -j "$(nproc)" --target llama-cli llama-bench llama-server \
  llama-quantize llama-tokenize llama-perplexity llama-gguf-split 2>&1 | tail -n 3
echo "$dir/build/bin"
