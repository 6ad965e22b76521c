#!/usr/bin/env bash
# longhaul against llama.cpp on a synthetic model with Qwen3-Next-80B-A3B's
# layer shapes (`longhaul gen-model --preset qwen3next-80b-scaled`: 16
# hybrid layers, 12 gated DeltaNet + 4 gated full attention, 512 experts
# top-10 of 512 plus a shared expert; 14.9 GB at q4_K): tools/bench-moe.sh
# (resident pp128/tg32 with llama-bench and `longhaul bench`, then cold
# decode under a memory cgroup below the file size, `longhaul --longhaul`
# against llama.cpp's mmap, with hit rate and expert GB read per token).
#
#   tools/bench-qwen3next.sh [-d DIR] [--plain] [bench-moe.sh options]
#
# Writes DIR/qwen3next-80b-scaled-q4_K-skew1.gguf (`--router-skew 1`; DIR
# defaults to /work/scratch13) when it is missing and benchmarks it, both
# halves. With --plain it benchmarks the unskewed
# DIR/qwen3next-80b-scaled-q4_K.gguf instead (written when missing). The
# two files take 30 GB together: delete the one you are done with. Other
# options go to tools/bench-moe.sh, e.g. --skip-limited, --limit 9G.
set -euo pipefail
dir=/work/scratch13 plain=0 rest=()
while [ $# -gt 0 ]; do
  case "$1" in
    -d|--dir) dir="$2"; shift 2 ;;
    --plain) plain=1; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) rest+=("$1"); shift ;;
  esac
done
root="$(cd "$(dirname "$0")/.." && pwd)"
longhaul="${LONGHAUL:-$root/target/release/longhaul}"
if [ ! -x "$longhaul" ]; then
  echo "building $longhaul ..." >&2
  (cd "$root" && CARGO_INCREMENTAL=0 cargo build --release -p longhaul-cli >&2)
fi
mkdir -p "$dir"
if [ "$plain" = 1 ]; then
  model="$dir/qwen3next-80b-scaled-q4_K.gguf" skew=0
else
  model="$dir/qwen3next-80b-scaled-q4_K-skew1.gguf" skew=1
fi
if [ ! -f "$model" ]; then
  "$longhaul" gen-model --preset qwen3next-80b-scaled --type q4_K --router-skew "$skew" -o "$model"
fi
exec "$root/tools/bench-moe.sh" -m "$model" "${rest[@]}"
