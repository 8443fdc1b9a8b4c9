#!/usr/bin/env bash
# The main job: set up, then show what hicachefs does, on mounts in a temporary directory, with a
# chat workload served through SGLang's client HiCacheFS (scripts/demo.py):
#   1. one host: a RAM tier smaller than the workload over a disk tier, so pages are demoted
#      to disk and promoted back; the mount as ls, du, df and getfattr see it;
#   2. a warm restart: hicachefs umount (RAM written down), mount again on the same disk, serve
#      the workload again: it hits from disk (hicachefs top and stats show it);
#   3. two hosts on one shared tier, a throw-away volume of the first engine that starts here,
#      GlusterFS first, then JuiceFS (each that does not start says why in one line; the part is
#      skipped when none does): host B serves the next turn of conversations host A served,
#      loading their prefixes from the shared tier.
# Whatever happens, every daemon is stopped with hicachefs umount and the volume taken down.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
work=$(realpath "$(mktemp -d /tmp/hicachefs-demo.XXXXXX)")
export TMPDIR=$work; unset XDG_RUNTIME_DIR  # the daemons' logs, in $work/hicachefs-<uid>/
export PATH="$root/.venv/bin:$root/scripts:$PATH"  # hicachefs, demo.py, glusterfs.sh, juicefs.sh
cd "$work"
mkdir mnt host-a host-b
started=$SECONDS

mounted() { awk -v m="$work/$1" '$2 == m {found=1} END {exit !found}' /proc/self/mounts; }

cleanup() {
  local status=$?
  cd "$work"
  for m in mnt host-a host-b; do
    mounted "$m" || continue
    hicachefs umount "$m" >/dev/null || fusermount3 -u "$m" || fusermount3 -uz "$m" || true
  done
  for engine in glusterfs juicefs; do
    [ -d "$engine" ] || continue
    "$engine.sh" down "$engine" >/dev/null || echo "demo: $engine.sh down $work/$engine failed" >&2
  done
  if [ "$status" -ne 0 ]; then
    for log in *.log hicachefs-*/*.log; do
      [ -f "$log" ] && { echo "== the end of $log"; tail -n 5 "$log"; }
    done
  fi
  cd /
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT

# Show a command, then run it.
run() {
  echo "\$ $*"
  "$@"
}

echo "(in $work)"
echo
echo "== 1. One host: a RAM tier smaller than the workload's pages, over a disk tier"
run hicachefs mount mnt --memory 128M --disk disk --disk-size 1G
run demo.py serve mnt "$@"
pool=$(find mnt -mindepth 4 -maxdepth 4 -type d -print -quit)
echo
echo "\$ ls -l $pool | head -4"
ls -l "$pool" | sed -n 1,4p
run du -sh mnt/*/
run df -h mnt
run getfattr -d "$(find "$pool" -type f -print -quit)"

echo "== 2. A warm restart: the RAM tier is written down, the disk tier's pages are served again"
run hicachefs umount mnt
run hicachefs mount mnt --memory 128M --disk disk --disk-size 1G
run hicachefs stats mnt
run demo.py serve mnt --show-top "$@"
echo
run hicachefs stats mnt
run hicachefs umount mnt

echo
# The second host's shared tier: the first engine that starts here, GlusterFS first.
engine=
for candidate in glusterfs juicefs; do
  if "$candidate.sh" up "$candidate" >"$candidate-up.log" 2>&1; then
    engine=$candidate
    break
  fi
  echo "(two hosts: $candidate.sh did not start a volume here: $(tail -n 1 "$candidate-up.log"))"
  "$candidate.sh" down "$candidate" >/dev/null 2>&1 || true
done
if [ -z "$engine" ]; then
  echo "== 3. Two hosts: skipped, no shared filesystem started here"
else
  name=$([ "$engine" = glusterfs ] && echo GlusterFS || echo JuiceFS)
  echo "== 3. Two hosts, one shared tier: a $name volume both mount (at $engine/a and $engine/b)"
  run hicachefs mount host-a --memory 512M --shared "$engine/a/hicachefs"
  run hicachefs mount host-b --memory 512M --shared "$engine/b/hicachefs"
  run demo.py two-hosts host-a host-b "$@"
  echo
  run hicachefs stats host-b
  run hicachefs umount host-a
  run hicachefs umount host-b
  run "$engine.sh" down "$engine"
fi
echo
echo "demo: done in $((SECONDS - started)) s"
