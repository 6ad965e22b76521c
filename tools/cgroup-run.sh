#!/usr/bin/env bash
# Runs a command inside a child memory cgroup (v1) of this process's own
# cgroup, with a memory limit that page cache counts against:
#   tools/cgroup-run.sh LIMIT_BYTES_OR_SUFFIX COMMAND...   (e.g. 8G)
# Needs root and the cgroup v1 memory controller (systemd-run is absent here).
set -euo pipefail
limit="$1"; shift
base="/sys/fs/cgroup/memory$(awk -F: '$2 == "memory" {print $3}' /proc/self/cgroup)"
cg="$base/longhaul-bench-$$"
mkdir -p "$cg"
trap 'echo $$ > "$base/cgroup.procs" 2>/dev/null || true; rmdir "$cg" 2>/dev/null || true' EXIT
echo "$limit" > "$cg/memory.limit_in_bytes"
echo 1 > "$cg/memory.oom_control" 2>/dev/null || true
echo $$ > "$cg/cgroup.procs"
"$@"
status=$?
echo "cgroup peak usage: $(( $(cat "$cg/memory.max_usage_in_bytes") / 1048576 )) MiB (limit $(( $(cat "$cg/memory.limit_in_bytes") / 1048576 )) MiB)" >&2
exit $status
