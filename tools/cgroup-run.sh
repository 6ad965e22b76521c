#!/usr/bin/env bash
# Runs a command inside a child memory cgroup of this process's own cgroup,
# with a memory limit that page cache counts against:
#   tools/cgroup-run.sh LIMIT_BYTES_OR_SUFFIX COMMAND...   (e.g. 8G)
# Needs root. Takes the cgroup v1 memory controller where it is mounted
# (this repository's 2-core VM), else cgroup v2 (memory.max; on v2, this
# cgroup's processes are first moved into a leaf child, since a v2 cgroup
# that hands the memory controller to its children may hold no processes
# itself). systemd-run is not assumed. Exits 125 without running COMMAND
# when neither can be set up.
set -euo pipefail
limit="$1"; shift
fail() { echo "cgroup-run: $*" >&2; exit 125; }

if [ -d /sys/fs/cgroup/memory ] && grep -q ':memory:' /proc/self/cgroup; then
  base="/sys/fs/cgroup/memory$(awk -F: '$2 == "memory" {print $3}' /proc/self/cgroup)"
  cg="$base/longhaul-bench-$$"
  mkdir -p "$cg" || fail "cannot make $cg"
  trap 'echo $$ > "$base/cgroup.procs" 2>/dev/null || true; rmdir "$cg" 2>/dev/null || true' EXIT
  echo "$limit" > "$cg/memory.limit_in_bytes"
  echo 1 > "$cg/memory.oom_control" 2>/dev/null || true
  echo $$ > "$cg/cgroup.procs"
  peak() { cat "$cg/memory.max_usage_in_bytes"; }
  max() { cat "$cg/memory.limit_in_bytes"; }
elif [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  base="/sys/fs/cgroup$(awk -F: '$1 == "0" {print $3}' /proc/self/cgroup)"
  base="${base%/}"
  grep -qw memory "$base/cgroup.controllers" 2>/dev/null ||
    fail "cgroup v2 at $base has no memory controller"
  if ! grep -qw memory "$base/cgroup.subtree_control"; then
    mkdir -p "$base/longhaul-leaf" || fail "cannot make $base/longhaul-leaf"
    for p in $(cat "$base/cgroup.procs"); do
      echo "$p" > "$base/longhaul-leaf/cgroup.procs" 2>/dev/null || true
    done
    echo +memory > "$base/cgroup.subtree_control" ||
      fail "cannot enable the memory controller under $base"
  fi
  cg="$base/longhaul-bench-$$"
  mkdir -p "$cg" || fail "cannot make $cg"
  trap 'rmdir "$cg" 2>/dev/null || true' EXIT
  echo "$limit" > "$cg/memory.max"
  echo 0 > "$cg/memory.swap.max" 2>/dev/null || true
  echo $$ > "$cg/cgroup.procs"
  peak() { cat "$cg/memory.peak" 2>/dev/null || echo 0; }
  max() { cat "$cg/memory.max"; }
else
  fail "no cgroup memory controller (v1 or v2) is mounted"
fi
status=0
"$@" || status=$?
echo "cgroup peak usage: $(( $(peak) / 1048576 )) MiB (limit $(( $(max) / 1048576 )) MiB)" >&2
exit $status
