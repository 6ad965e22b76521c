#!/usr/bin/env bash
# longhaul against llama.cpp on one MoE GGUF (the synthetic presets of
# `longhaul gen-model`; tools/bench-deepseek.sh and tools/bench-qwen3next.sh
# say which file and generate it), CPU, the same threads for both:
#
#   1. resident: `llama-bench` (its defaults: mmap, CPU repack) and
#      `longhaul bench` (its defaults) at pp128 and tg32;
#   2. under a memory cgroup below the file size (tools/cgroup-run.sh, page
#      cache counted): `longhaul bench --longhaul` decode (tg32, cold: no
#      warmup, one repetition) against llama.cpp's mmap decode (`-lm mmap
#      --repack 0`: repack copies the weights into anonymous memory and is
#      OOM-killed under such a limit). Longhaul's hit rate and expert GB read
#      per generated token are printed.
#
# The file's pages are dropped from the page cache (posix_fadvise DONTNEED on
# this file only) before each constrained run, so both start cold.
#
#   tools/bench-moe.sh -m MODEL [-t 2] [-r 3] [--limit 6G] [--cache 3]
#                      [--n-gen 32] [--skip-resident] [--skip-limited]
#                      [--limited-model MODEL2] [--nice N]
#
# --limit defaults to 60% of the file size, --cache (GiB of expert slots) to
# half the limit. --limited-model runs the memory-limited half on another
# file (e.g. the --router-skew 1 twin of the resident one; the limit is then
# relative to that file). --nice N runs both engines under `nice -n N`
# (root may give a negative N): on a machine shared with other work, so that
# neither engine loses its cores to it (llama.cpp's OpenMP threads suffer
# most). LLAMA_BENCH (default
# ~/.cache/longhaul/llama.cpp/build/bin/llama-bench, built with
# `cmake --build ~/.cache/longhaul/llama.cpp/build --target llama-bench -j2`
# when missing) and LONGHAUL (default target/release/longhaul) pick the
# binaries. The memory-limited half needs root (cgroup v1).
set -euo pipefail

model="" limited_model="" nice_n="" threads=2 reps=3 limit="" cache="" n_gen=32 resident=1 limited=1
while [ $# -gt 0 ]; do
  case "$1" in
    -m|--model) model="$2"; shift 2 ;;
    -t|--threads) threads="$2"; shift 2 ;;
    -r|--repetitions) reps="$2"; shift 2 ;;
    --limit) limit="$2"; shift 2 ;;
    --cache) cache="$2"; shift 2 ;;
    --n-gen) n_gen="$2"; shift 2 ;;
    --skip-resident) resident=0; shift ;;
    --skip-limited) limited=0; shift ;;
    --limited-model) limited_model="$2"; shift 2 ;;
    --nice) nice_n="$2"; shift 2 ;;
    -h|--help) sed -n '2,34p' "$0"; exit 0 ;;
    *) echo "bench-moe: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$model" ] || { echo "bench-moe: give the model with -m FILE" >&2; exit 2; }
limited_model="${limited_model:-$model}"
for f in "$model" "$limited_model"; do
  [ -f "$f" ] || { echo "bench-moe: $f does not exist" >&2; exit 2; }
done

root="$(cd "$(dirname "$0")/.." && pwd)"
run=()
[ -z "$nice_n" ] || run=(nice -n "$nice_n")
llama_dir="$HOME/.cache/longhaul/llama.cpp"
llama_bench="${LLAMA_BENCH:-$llama_dir/build/bin/llama-bench}"
longhaul="${LONGHAUL:-$root/target/release/longhaul}"
if [ ! -x "$llama_bench" ]; then
  echo "building llama-bench ..." >&2
  PATH="$llama_dir/tools-venv/bin:$PATH" cmake --build "$llama_dir/build" --target llama-bench -j2 >&2
fi
if [ ! -x "$longhaul" ]; then
  echo "building $longhaul ..." >&2
  (cd "$root" && CARGO_INCREMENTAL=0 cargo build --release -p longhaul-cli >&2)
fi

size=$(stat -c %s "$model")
limited_size=$(stat -c %s "$limited_model")
gib() { python3 -c "import sys; print(f'{float(sys.argv[1]) / 2**30:.2f}')" "$1"; }
to_bytes() {
  python3 - "$1" <<'PY'
import sys
s = sys.argv[1].strip()
mult = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
print(int(float(s[:-1]) * mult[s[-1].upper()]) if s[-1].upper() in mult else int(s))
PY
}
limit_bytes=$([ -n "$limit" ] && to_bytes "$limit" || echo $((limited_size * 6 / 10)))
cache=${cache:-$(python3 -c "import sys; print(f'{int(sys.argv[1]) / 2 / 2**30:.2f}')" "$limit_bytes")}

drop_file_cache() {
  python3 - "$limited_model" <<'PY'
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
os.close(fd)
PY
}

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# Other processes on the machine skew every number: the load average before
# each half is printed with its table.
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
echo "model: $(basename "$model"), $(gib "$size") GiB, threads $threads${nice_n:+, nice $nice_n}" >&2

if [ "$resident" = 1 ]; then
  loadavg >"$work/load-resident"
  echo "resident: llama-bench pp128 tg32 ($reps repetitions)" >&2
  "${run[@]}" "$llama_bench" -m "$model" -t "$threads" -p 128 -n "$n_gen" -r "$reps" -ngl 0 -o json \
    >"$work/llama.json" 2>"$work/llama.err" || { cat "$work/llama.err" >&2; exit 1; }
  echo "resident: longhaul bench pp128 tg32 ($reps repetitions)" >&2
  "${run[@]}" "$longhaul" bench -m "$model" -t "$threads" -p 128 -n "$n_gen" -r "$reps" -o json \
    >"$work/longhaul.json" 2>"$work/longhaul.err" || { cat "$work/longhaul.err" >&2; echo "(longhaul failed; the table shows llama.cpp alone)" >&2; echo '[]' >"$work/longhaul.json"; }
fi

if [ "$limited" = 1 ]; then
  loadavg >"$work/load-limited"
  echo "limited: $(basename "$limited_model"), $(gib "$limited_size") GiB; limit $(gib "$limit_bytes") GiB, longhaul cache $cache GiB" >&2
  drop_file_cache
  echo "limited: longhaul bench --longhaul tg$n_gen (cold, 1 repetition)" >&2
  "$root/tools/cgroup-run.sh" "$limit_bytes" "${run[@]}" "$longhaul" bench -m "$limited_model" -t "$threads" -p 0 -n "$n_gen" \
    -r 1 --no-warmup --longhaul --longhaul-cache "$cache" -o json \
    >"$work/lh-limited.json" 2>"$work/lh-limited.err" || { cat "$work/lh-limited.err" >&2; echo "(longhaul failed under the limit)" >&2; echo '[]' >"$work/lh-limited.json"; }
  grep "cgroup peak" "$work/lh-limited.err" >&2 || true
  drop_file_cache
  echo "limited: llama-bench mmap tg$n_gen (cold, 1 repetition, --repack 0)" >&2
  "$root/tools/cgroup-run.sh" "$limit_bytes" "${run[@]}" "$llama_bench" -m "$limited_model" -t "$threads" -p 0 -n "$n_gen" \
    -r 1 --no-warmup -ngl 0 -lm mmap --repack 0 -o json \
    >"$work/llama-limited.json" 2>"$work/llama-limited.err" || { cat "$work/llama-limited.err" >&2; echo "(llama-bench failed under the limit)" >&2; echo '[]' >"$work/llama-limited.json"; }
  grep "cgroup peak" "$work/llama-limited.err" >&2 || true
fi

python3 - "$work" "$n_gen" "$(gib "$limit_bytes")" "$cache" <<'PY'
import json, os, sys
work, n_gen, limit, cache = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]

def load(name):
    p = os.path.join(work, name)
    if not os.path.exists(p):
        return None
    text = open(p).read().strip()
    return json.loads(text) if text else []

def test(r):
    p, g = r["n_prompt"], r["n_gen"]
    return f"pp{p}" if g == 0 else (f"tg{g}" if p == 0 else f"pp{p}+tg{g}")

def ts(r):
    return f"{r['avg_ts']:.2f} ± {r.get('stddev_ts', 0):.2f}"

def loadavg(half):
    p = os.path.join(work, f"load-{half}")
    return open(p).read().strip() if os.path.exists(p) else "?"

def samples(r):
    v = sorted(r.get("samples_ts", []))
    if not v:
        return "-"
    med = v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2
    each = ", ".join(f"{x:.2f}" for x in r.get("samples_ts", []))
    return f"median {med:.2f}, best {v[-1]:.2f} ({each})"

ll, lh = load("llama.json"), load("longhaul.json")
if ll is not None:
    print(f"resident (each engine's defaults; load average before: {loadavg('resident')})\n")
    print("| test | llama.cpp t/s | longhaul t/s | longhaul / llama.cpp |")
    print("| ---- | ------------: | -----------: | -------------------: |")
    a = {test(r): r for r in ll}
    b = {test(r): r for r in lh or []}
    for t in sorted(a, key=lambda s: (not s.startswith("pp"), s)):
        x = b.get(t)
        ratio = f"{x['avg_ts'] / a[t]['avg_ts']:.2f}" if x else "-"
        print(f"| {t} | {ts(a[t])} | {ts(x) if x else '-'} | {ratio} |")
    # Other work on the machine only ever slows a repetition down: the
    # best one is the least disturbed.
    print("\nper repetition (t/s):\n")
    for t in sorted(a, key=lambda s: (not s.startswith("pp"), s)):
        x = b.get(t)
        print(f"- {t} llama.cpp: {samples(a[t])}")
        print(f"- {t} longhaul: {samples(x) if x else '-'}")
    print()

lhl, lll = load("lh-limited.json"), load("llama-limited.json")
if lhl is not None:
    print(f"memory limit {limit} GiB, cold decode tg{n_gen} (load average before: {loadavg('limited')})\n")
    print("| engine | t/s | hit rate | expert GB read / token |")
    print("| ------ | --: | -------: | ---------------------: |")
    for r in lhl:
        hit = r.get("longhaul_hit_rate")
        read = r.get("longhaul_bytes_read")
        print(f"| longhaul --longhaul-cache {cache} | {ts(r)} | "
              f"{'-' if hit is None else f'{100 * hit:.1f}%'} | "
              f"{'-' if read is None else f'{read / 1e9 / n_gen:.3f}'} |")
    for r in lll or []:
        print(f"| llama.cpp mmap, --repack 0 | {ts(r)} | - | - |")
PY
