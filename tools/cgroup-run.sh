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

# Per version: the cgroup to make the child in, the one this shell goes back
# to before the child is removed, and the child's limit and peak files.
if [ -d /sys/fs/cgroup/memory ] && grep -q ':memory:' /proc/self/cgroup; then
  base="/sys/fs/cgroup/memory$(awk -F: '$2 == "memory" {print $3}' /proc/self/cgroup)"
  home="$base" limit_file=memory.limit_in_bytes peak_file=memory.max_usage_in_bytes
elif [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  base="/sys/fs/cgroup$(awk -F: '$1 == "0" {print $3}' /proc/self/cgroup)"
  base="${base%/}" home="$base" limit_file=memory.max peak_file=memory.peak
  grep -qw memory "$base/cgroup.controllers" 2>/dev/null ||
    fail "cgroup v2 at $base has no memory controller"
  if ! grep -qw memory "$base/cgroup.subtree_control"; then
    home="$base/longhaul-leaf"
    mkdir -p "$home" || fail "cannot make $home"
    for p in $(cat "$base/cgroup.procs"); do
      echo "$p" > "$home/cgroup.procs" 2>/dev/null || true
    done
    echo +memory > "$base/cgroup.subtree_control" ||
      fail "cannot enable the memory controller under $base"
  fi
else
  fail "no cgroup memory controller (v1 or v2) is mounted"
fi
cg="$base/longhaul-bench-$$"
mkdir -p "$cg" || fail "cannot make $cg"
trap 'echo $$ > "$home/cgroup.procs" 2>/dev/null || true; rmdir "$cg" 2>/dev/null || true' EXIT
echo "$limit" > "$cg/$limit_file"
# v1: wait, not kill, at the limit; v2: no swap either.
[ ! -e "$cg/memory.oom_control" ] || echo 1 > "$cg/memory.oom_control" || true
[ ! -e "$cg/memory.swap.max" ] || echo 0 > "$cg/memory.swap.max" || true
echo $$ > "$cg/cgroup.procs"
status=0
"$@" || status=$?
peak=$(cat "$cg/$peak_file" 2>/dev/null || echo 0)
echo "cgroup peak usage: $(( peak / 1048576 )) MiB (limit $(( $(cat "$cg/$limit_file") / 1048576 )) MiB)" >&2
exit $status
