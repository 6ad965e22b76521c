#!/usr/bin/env bash
# Download llama.cpp's source (vendored in the llama-cpp-python sdist on PyPI)
# and build the reference tools outside the repository.
#   LLAMACPP_DIR (default: ~/.cache/longhaul/llama.cpp) receives source and build.
#   LLAMA_CPP_PYTHON_VERSION (default: 0.3.36) pins the sdist, hence the llama.cpp
#   revision the goldens in tests/goldens were made with.
# Builds the tools below plus llama-imatrix and test-backend-ops (LLAMA_BUILD_TESTS=ON).
# Needs python3 + pip, a C/C++ compiler; cmake is taken from PATH or installed
# (as a PyPI wheel) into "$LLAMACPP_DIR/tools-venv".
# LLAMACPP_CPU_VARIANTS (default: none), a comma list of noamx and avx2, also
# builds ggml's CPU backend alone for those instruction sets, in build-VARIANT/bin:
#   noamx  AVX-512 (F/BW/VL/VNNI/VBMI/BF16) without AMX: on a VM that reports AMX
#          but cannot run it (SIGILL in ggml's AMX buffer), llama.cpp at its
#          defaults (`--repack` on) with LD_LIBRARY_PATH=$LLAMACPP_DIR/build-noamx/bin
#   avx2   AVX2 + FMA + F16C + BMI2 only: llama.cpp as an AVX2 CPU runs it
# Prints the bin directory on its last line.
set -euo pipefail
dir="${LLAMACPP_DIR:-$HOME/.cache/longhaul/llama.cpp}"
ver="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
mkdir -p "$dir"
cd "$dir"
if [ ! -f src/vendor/llama.cpp/CMakeLists.txt ]; then
  tmp="$(mktemp -d "$dir/dl.XXXXXX")"
  # Only llama-cpp-python itself must be an sdist: `--no-binary :all:` would also
  # force its build dependencies (cmake!) to be compiled from source.
  python3 -m pip download --no-deps --no-binary llama-cpp-python -d "$tmp" "llama-cpp-python==$ver"
  rm -rf src && mkdir -p src && tar -xzf "$tmp"/llama_cpp_python-*.tar.gz -C src --strip-components=1
  rm -rf "$tmp"
fi
if ! command -v cmake >/dev/null 2>&1; then
  if [ ! -x tools-venv/bin/cmake ]; then
    python3 -m venv tools-venv
    tools-venv/bin/python -m pip install -q cmake ninja
  fi
  export PATH="$dir/tools-venv/bin:$PATH"
fi
src="$dir/src/vendor/llama.cpp"
cmake -S "$src" -B build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=ON \
  -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON >/dev/null
cmake --build build -j "$(nproc)" --target llama-cli llama-completion llama-bench llama-server \
  llama-quantize llama-tokenize llama-perplexity llama-gguf-split 2>&1 | tail -n 3 || \
cmake --build build -j "$(nproc)" --target llama-cli llama-bench llama-server \
  llama-quantize llama-tokenize llama-perplexity llama-gguf-split 2>&1 | tail -n 3
# llama-imatrix (importance matrices for the i-quant fixtures, tools/make-iq-fixtures.sh) and
# test-backend-ops (ggml's own per-op checks; needs LLAMA_BUILD_TESTS=ON above, which only
# adds targets: building them relinks nothing that the tools above use)
cmake --build build -j "$(nproc)" --target llama-imatrix test-backend-ops 2>&1 | tail -n 3
IFS=, read -r -a variants <<< "${LLAMACPP_CPU_VARIANTS:-}"
for v in "${variants[@]}"; do
  case "$v" in
    noamx) flags=(-DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON
                  -DGGML_AVX_VNNI=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF) ;;
    avx2) flags=(-DGGML_AVX512=OFF) ;;
    *) echo "build-llamacpp.sh: unknown CPU variant $v (noamx, avx2)" >&2; exit 2 ;;
  esac
  cmake -S "$src" -B "build-$v" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=OFF \
    -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON "${flags[@]}" \
    -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >/dev/null
  cmake --build "build-$v" -j "$(nproc)" --target ggml-cpu 2>&1 | tail -n 1
done
echo "$dir/build/bin"
