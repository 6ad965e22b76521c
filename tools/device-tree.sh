#!/usr/bin/env bash
# The working tree a `device` call sends is at most 64 MiB; this repository
# tracks more (tests/fixtures and tests/goldens). The device scripts
# (tools/gpu-h200.sh, tools/cpu-floor-device.sh) take those two folders out
# of the index for a call and put them back after:
#   tools/device-tree.sh shrink EXTRA_IGNORED...   (e.g. /.devcarry/ /.gl/)
#   tools/device-tree.sh restore
# `shrink` runs `git rm -r --cached` (the files stay on disk) and lists the
# folders in .git/info/exclude meanwhile, with the carried folders named.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  shrink)
    shift
    mkdir -p .git/info && touch .git/info/exclude
    for p in "$@" /tests/fixtures/ /tests/goldens/; do
      grep -qxF "$p" .git/info/exclude || echo "$p" >>.git/info/exclude
    done
    git rm -r -q --cached tests/fixtures tests/goldens
    echo "tracked files now: $(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) bytes"
    ;;
  restore)
    git reset -q -- tests/fixtures tests/goldens
    sed -i '\#^/tests/fixtures/$#d; \#^/tests/goldens/$#d' .git/info/exclude
    git status --short | head
    ;;
  *) echo "usage: tools/device-tree.sh shrink EXTRA_IGNORED... | restore" >&2; exit 2 ;;
esac
