#!/usr/bin/env bash
# Fuzzes longhaul: builds the fuzz targets of fuzz/ (nightly toolchain and
# cargo-fuzz: `cargo install cargo-fuzz`), writes the seed corpora when they
# are missing (`cargo run --example fuzz_seeds`, into fuzz/corpus/, not
# committed) and runs TARGET for SECONDS on one core, then prints libFuzzer's
# final statistics (executions, executions per second, peak memory).
#
#   tools/fuzz.sh gguf_header 600          # the header parser
#   tools/fuzz.sh load_path 3600           # open, load, tokenizer, template, decode
#   tools/fuzz.sh grammar 600              # GBNF, Lark and JSON schemas, compiled and followed
#   tools/fuzz.sh all 600                  # each target in turn, SECONDS each
#   tools/fuzz.sh load_path 0 -runs=1000   # extra arguments go to libFuzzer
#
# A panic, an abort, more than 2 GiB of memory (RSS or one allocation) or
# more than 10 s for one input is a finding: libFuzzer stops and writes the
# input to fuzz/artifacts/TARGET/; reproduce it with
# `cargo +nightly fuzz run TARGET fuzz/artifacts/TARGET/crash-...` and shrink
# it with `-minimize_crash=1`. The full log is in fuzz/logs/. SECONDS 0 means
# no time limit (give -runs=N instead).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 2 ]; then
    echo "usage: $0 gguf_header|load_path|grammar|all SECONDS [LIBFUZZER ARGS...]" >&2
    exit 2
fi
target=$1
secs=$2
shift 2
case "$target" in
    all) targets=(gguf_header load_path grammar) ;;
    gguf_header | load_path | grammar) targets=("$target") ;;
    *)
        echo "unknown target \`$target\`; use gguf_header, load_path, grammar or all" >&2
        exit 2
        ;;
esac
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "cargo-fuzz is missing: cargo install cargo-fuzz" >&2
    exit 1
fi

# The fuzz crate is its own workspace; start its lock file from the main
# one so both build the same dependency versions.
[ -f fuzz/Cargo.lock ] || cp Cargo.lock fuzz/Cargo.lock
for t in "${targets[@]}"; do
    cargo +nightly fuzz build "$t"
done
if [ -z "$(ls -A fuzz/corpus/load_path 2>/dev/null)" ] ||
    [ -z "$(ls -A fuzz/corpus/gguf_header 2>/dev/null)" ] ||
    [ -z "$(ls -A fuzz/corpus/grammar 2>/dev/null)" ]; then
    cargo run --quiet --example fuzz_seeds -- fuzz/corpus
fi

# The load-path target writes each input as a model file: keep those on
# tmpfs, in a directory removed at exit.
work=$(mktemp -d /dev/shm/longhaul-fuzz.XXXXXX 2>/dev/null || mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p fuzz/logs
status=0
for t in "${targets[@]}"; do
    log="fuzz/logs/$t-$(date -u +%Y%m%dT%H%M%SZ).log"
    mkdir -p "fuzz/artifacts/$t"
    echo "fuzzing $t for ${secs}s, log in $log" >&2
    # No allocation stacks in AddressSanitizer reports (a tenth of the
    # time of an execution); reproduce a finding without this for them.
    ASAN_OPTIONS="${ASAN_OPTIONS:-malloc_context_size=0}" \
        TMPDIR="$work" RAYON_NUM_THREADS=1 cargo +nightly fuzz run "$t" "fuzz/corpus/$t" -- \
        -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048 \
        -print_final_stats=1 "$@" >"$log" 2>&1 || status=$?
    echo "== $t (exit $status)"
    grep -E '^(#[0-9]+[[:space:]]+DONE|stat::|==[0-9]+== ERROR|SUMMARY|Test unit written|Failing input)|panicked at' "$log" || tail -20 "$log"
    [ "$status" -eq 0 ] || break
done
exit "$status"
