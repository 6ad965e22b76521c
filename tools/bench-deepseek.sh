#!/usr/bin/env bash
# longhaul against llama.cpp on a synthetic DeepSeek-V2-Lite-shaped model
# (`longhaul gen-model --preset deepseek2-lite --type q4_K [--router-skew 1]`):
# tools/bench-moe.sh on that file (resident pp128/tg32, then cold decode
# under a memory cgroup below the file size); see its --help.
#
#   tools/bench-deepseek.sh -m MODEL [-t 2] [-r 3] [--limit 6G] [--cache 3]
#                           [--n-gen 32] [--skip-resident] [--skip-limited]
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,8p' "$0"; echo; exec "$(dirname "$0")/bench-moe.sh" --help ;; esac
exec "$(dirname "$0")/bench-moe.sh" "$@"
