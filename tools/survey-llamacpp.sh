#!/usr/bin/env bash
# llama.cpp's side of `longhaul bench --survey`: builds tools/ggml_mul_mat_bench.cpp
# against the llama.cpp build of tools/build-llamacpp.sh and times ggml's CPU
# mul_mat for the survey's shapes, types and token counts. Prints the lines
# `longhaul bench --survey --llamacpp FILE` reads:
#   tools/survey-llamacpp.sh -t 2 > /tmp/ggml.txt
#   longhaul bench --survey -t 2 --llamacpp /tmp/ggml.txt --survey-out /tmp/survey
# Flags (all optional):
#   -t THREADS          comma-separated thread counts (default: 2)
#   -r REPS             repetitions (default: 5)
#   --shapes KxN,...    expert matrices, rows of K values, N rows (default:
#                       Qwen3-30B-A3B's gate/up and down, 2048x768,768x2048)
#   --tokens N,...      token counts (default: 1,8,32,512, the survey's)
#   --types T,...       ggml type names (default: every type longhaul supports)
#   --min-ms MS         each repetition lasts at least MS (default: 20, the survey's)
#   --poll N            ggml thread pool polling level 0..100 (default: ggml's, 50)
#   --repack 0|1        1: weights in ggml's CPU_REPACK buffer (llama.cpp's default
#                       --repack; on x86 AVX2 it interleaves Q4_0, Q4_K, IQ4_NL and
#                       MXFP4 matrices of 8k rows), the side to compare with
#                       longhaul's default `bench --survey --repack 1`; 0 (default):
#                       plain buffers, the GGUF layout
# LLAMACPP_DIR (default ~/.cache/longhaul/llama.cpp) holds the build; the tool
# is compiled into $LLAMACPP_DIR/survey/. Weights are in plain CPU buffers
# (no repack), as longhaul reads GGUF bytes in place. (For ggml's own op
# tests across backends, tools/build-llamacpp.sh can build test-backend-ops;
# this tool gives the survey's exact shapes.)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="${LLAMACPP_DIR:-$HOME/.cache/longhaul/llama.cpp}"
bin="$dir/build/bin"
inc="$dir/src/vendor/llama.cpp/ggml/include"
threads=2 reps=5 min_ms=20 poll=-1 repack=0
shapes="2048x768,768x2048"
tokens="1,8,32,512"
types="f32,f16,bf16,q4_0,q4_1,q5_0,q5_1,q8_0,q2_K,q3_K,q4_K,q5_K,q6_K,iq4_nl,iq4_xs,mxfp4,nvfp4,iq1_s,iq1_m,iq2_xxs,iq2_xs,iq2_s,iq3_xxs,iq3_s"
while [ $# -gt 0 ]; do
  case "$1" in
    -t) threads="$2"; shift 2 ;;
    -r) reps="$2"; shift 2 ;;
    --shapes) shapes="$2"; shift 2 ;;
    --tokens) tokens="$2"; shift 2 ;;
    --types) types="$2"; shift 2 ;;
    --min-ms) min_ms="$2"; shift 2 ;;
    --poll) poll="$2"; shift 2 ;;
    --repack) repack="$2"; shift 2 ;;
    *) echo "survey-llamacpp.sh: unknown flag $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
if [ ! -e "$bin/libggml-cpu.so" ] || [ ! -d "$inc" ]; then
  echo "survey-llamacpp.sh: no llama.cpp build in $dir; run tools/build-llamacpp.sh first" >&2
  exit 1
fi
out="$dir/survey"
mkdir -p "$out"
tool="$out/ggml_mul_mat_bench"
if [ ! -x "$tool" ] || [ "$root/tools/ggml_mul_mat_bench.cpp" -nt "$tool" ]; then
  g++ -O2 -std=c++17 "$root/tools/ggml_mul_mat_bench.cpp" -I"$inc" \
    -L"$bin" -lggml -lggml-base -lggml-cpu -Wl,-rpath,"$bin" -o "$tool"
fi
IFS=, read -r -a shape_list <<< "$shapes"
IFS=, read -r -a thread_list <<< "$threads"
for t in "${thread_list[@]}"; do
  for s in "${shape_list[@]}"; do
    k="${s%x*}" m="${s#*x}"
    "$tool" --types "$types" --k "$k" --m "$m" --n "$tokens" --threads "$t" --reps "$reps" --min-ms "$min_ms" --poll "$poll" --repack "$repack"
  done
done
