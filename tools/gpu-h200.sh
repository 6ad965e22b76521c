#!/usr/bin/env bash
# The GPU speed check of issue 18 on a lent machine (an H200 through the
# `device` tool), in one call: GPU tests, mat-vec GB/s against the card's
# bandwidth, and end-to-end pp512 / tg128 on the Qwen3-30B-A3B-shaped Q4_K
# model, resident, with the experts' routing on the device.
#
# That machine has no Rust toolchain and reaches nothing, and the device
# tool sends at most 64 MiB of working tree (this repository tracks more:
# the fixtures and goldens). So:
#
#   1. here:   bash tools/gpu-h200.sh prepare
#      builds the x86-64 binaries (release, stripped, xz-compressed) and the
#      GPU tests' fixtures into .devcarry/, downloads the Vulkan loader packages into
#      .gl/, and takes tests/fixtures and tests/goldens out of the index for
#      the call (tools/device-tree.sh: `git rm -r --cached`; the files stay
#      on disk, and .git/info/exclude ignores them meanwhile);
#   2. device run: command `bash tools/gpu-h200.sh run`, carry
#      [".devcarry", ".gl"], timeout_s 600 (it took under 5 minutes on
#      2026-12-04); its tables come back in $OUT/gpu-h200.md and the full
#      log in $OUT/log.txt;
#   3. here:   bash tools/gpu-h200.sh restore   (puts the index back).
#
# llama.cpp's Vulkan build needs the Vulkan headers and glslc, which that
# machine does not have; its numbers are not part of this run.
#
# The tests run one at a time: run four at a time there, a test thread
# sometimes crashed as it ended, inside libEGL.so.1 (the carried glvnd
# loader under NVIDIA's Vulkan driver; cuda-gdb backtrace, 2026-12-04),
# while each test alone passed. get_rows_matches_ggml_goldens is skipped:
# it reads tests/goldens, which does not travel.
set -uo pipefail
cd "$(dirname "$0")/.."

# The GPU test files carried (the others need fixtures beyond the 64 MiB).
GPU_TESTS="gpu_route gpu_matmul gpu_attention gpu_ops gpu_recurrent gpu_slots gpu_speculative"

prepare() {
  set -e
  cargo build --release -p longhaul-cli
  cargo bench --no-run --bench gpu_bandwidth
  local json tests=()
  json=$(cargo test --release --no-run --message-format=json \
    $(for t in $GPU_TESTS; do echo --test "$t"; done) 2>/dev/null)
  mapfile -t tests < <(echo "$json" | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["executable"])')
  rm -rf .devcarry && mkdir -p .devcarry/bin .devcarry/fixtures
  cp target/release/longhaul .devcarry/bin/
  cp "$(ls -t target/release/deps/gpu_bandwidth-* | grep -v '\.d$' | head -1)" .devcarry/bin/gpu_bandwidth
  for t in "${tests[@]}"; do cp "$t" ".devcarry/bin/$(basename "$t" | sed 's/-[0-9a-f]*$//')"; done
  strip .devcarry/bin/*
  # xz: the test binaries are mostly wgpu and naga, and compress about 4x.
  xz -T2 -6 .devcarry/bin/*
  # What travels: these, .gl and the rest of the tree, within the tool's 64 MiB.
  # The fixtures tests/gpu_route.rs opens (the other GPU tests make their own inputs).
  for a in llama-moe qwen2moe qwen3moe gpt-oss olmoe glm4moe deepseek2 deepseek3 deepseek3-lite \
    laguna-head laguna-elem qwen3next qwen35moe; do
    cp "tests/fixtures/$a-q4_k_m.gguf" .devcarry/fixtures/
  done
  cp tests/fixtures/{qwen3moe,deepseek3,qwen2moe,gpt-oss}-q8_0.gguf tests/fixtures/iqmoe-mix.gguf \
    tests/fixtures/qwen3moe-f32.gguf .devcarry/fixtures/
  if [ ! -d .gl ]; then
    mkdir -p .gl /tmp/amd64/partial
    local o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
    # shellcheck disable=SC2086
    apt-get $o update -qq
    # shellcheck disable=SC2086
    (cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
  fi
  tools/device-tree.sh shrink /.gl/ /.devcarry/
  du -sh .devcarry .gl
  echo "ready: run 'bash tools/gpu-h200.sh run' on the device with carry [.devcarry, .gl], then 'bash tools/gpu-h200.sh restore'"
}

restore() {
  tools/device-tree.sh restore
}

run() {
  local out="${OUT:-/tmp/gpu-h200}" md m=/tmp/qwen3-30b-a3b-q4_k.gguf bin=.devcarry/bin
  mkdir -p "$out"
  md="$out/gpu-h200.md"
  exec > >(tee "$out/log.txt") 2>&1
  xz -d -T0 "$bin"/*.xz && chmod +x "$bin"/*
  # The model is CPU and disk work: made while the GPU tests run.
  "$bin/longhaul" gen-model --preset qwen3-30b-a3b --type q4_K -o "$m" --force >"$out/gen.txt" 2>&1 &
  local gen=$!
  for f in .gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
  export WGPU_BACKEND=vulkan
  if [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
  fi
  nvidia-smi --query-gpu=name,memory.total,clocks.max.memory,driver_version --format=csv || true
  # The test binaries look for the repository where they were built.
  local root="/work/main"
  if [ "$(pwd)" != "$root" ]; then mkdir -p /work && ln -sfn "$(pwd)" "$root"; fi
  mkdir -p tests/fixtures && cp --update=none .devcarry/fixtures/* tests/fixtures/
  {
    echo "# GPU check on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
    echo
    echo "## GPU tests"
    echo
  } >"$md"
  for t in $GPU_TESTS; do
    if timeout 100 "$bin/$t" --test-threads 1 --skip get_rows_matches_ggml_goldens \
      >"$out/tests.txt.part" 2>&1; then r=passed; else r="FAILED ($?)"; fi
    { echo "### $t"; cat "$out/tests.txt.part"; } >>"$out/tests.txt"
    echo "- $t: $r ($(grep -E '^test result' "$out/tests.txt.part" | tail -1))" | tee -a "$md"
    grep -E '^test .* FAILED|panicked' "$out/tests.txt.part" | head -5 | tee -a "$md"
  done
  rm -f "$out/tests.txt.part"
  {
    echo
    echo "## Mat-vec bandwidth (H200 HBM3e: 4800 GB/s)"
    echo
  } >>"$md"
  timeout 90 "$bin/gpu_bandwidth" --gpu-bw 4800 -r 50 | tee -a "$md"
  timeout 40 "$bin/gpu_bandwidth" -r 20 | grep "adapter bandwidth" | tee -a "$md"
  wait "$gen"
  tail -2 "$out/gen.txt"
  {
    echo
    echo "## Qwen3-30B-A3B-shaped Q4_K, -ngl 99 (resident), then longhaul on the GPU, then the CPU"
    echo
  } >>"$md"
  timeout 150 "$bin/longhaul" bench -m "$m" -ngl 99 -p 512 -n 128 -r 2 --gpu-bw 4800 | tee -a "$md"
  timeout 60 "$bin/longhaul" bench -m "$m" -ngl 99 -p 0 -n 32 -r 1 --longhaul --longhaul-cache 8 | tee -a "$md"
  timeout 45 "$bin/longhaul" bench -m "$m" -ngl 0 -p 0 -n 16 -r 1 | tee -a "$md"
  cat "$md"
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  restore) restore ;;
  *) echo "usage: tools/gpu-h200.sh prepare | run | restore (see the header)" >&2; exit 2 ;;
esac
