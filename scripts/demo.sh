#!/usr/bin/env bash
# The main job: set up, mount hicachefs with default settings in a temporary directory, drive a
# serving workload through the SGLang client, show the mount as a person would, unmount.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
cd "$root"
work=$(mktemp -d /tmp/hicachefs-demo.XXXXXX)
mnt="$work/mnt"
mkdir -p "$mnt"
cleanup() {
  if mountpoint -q "$mnt"; then
    .venv/bin/hicachefs umount "$mnt" || fusermount3 -u "$mnt" || fusermount3 -uz "$mnt"
  fi
  rm -rf "$work"
}
trap cleanup EXIT

.venv/bin/hicachefs mount "$mnt" --log-file "$work/daemon.log"
.venv/bin/python scripts/demo.py --mountpoint "$mnt" "$@"

echo
echo "== ls -la of one pool directory (first entries)"
pool=$(find "$mnt" -mindepth 4 -maxdepth 4 -type d -print -quit)
ls -la "$pool" | sed -n 1,6p
echo "== du -sh / df -h"
du -sh "$mnt"/*/
df -h "$mnt"
echo "== getfattr -d of one page"
getfattr -d "$(find "$pool" -type f -print -quit)"
echo "== hicachefs stats"
.venv/bin/hicachefs stats "$mnt"
.venv/bin/hicachefs umount "$mnt"
