#!/bin/sh
# Review repro (fix/cluster): the cluster drills pass with the R3 read fix turned off.
#
# It copies src/ to a temp dir, makes NatsStore._replicated() return False (journal
# reads and last_in_journal go back to plain Direct Gets from any replica, as before
# 2d13476), and runs tests/chaos/test_cluster_drills.py against that copy (workers
# inherit PYTHONPATH). Seen here: "3 passed in 25.68s". So no drill exercises the
# stale-follower read the fix removes; only test_r3's targeted read-your-write test
# does. Run from the worktree root:  sh review/rev-cluster/drills_without_the_fix.sh
set -eu
root=$(pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r "$root/src" "$tmp/src"
python3 - "$tmp/src/fusee/adapters/jetstream/store.py" <<'PY'
import sys
p = sys.argv[1]
s = open(p).read()
old = "    async def _replicated(self) -> bool:\n"
assert old in s, "NatsStore._replicated not found"
s = s.replace(old, old + "        return False  # review: the leader-tail check off\n", 1)
open(p, "w").write(s)
PY
PYTHONPATH="$tmp/src:$root" /work/main/.venv/bin/python -m pytest -q -s -p no:xdist \
  -p no:cacheprovider tests/chaos/test_cluster_drills.py
