#!/usr/bin/env bash
# A throw-away one-node GlusterFS volume, mounted twice: the two "hosts" of the shared-tier tests.
#
#   scripts/glusterfs.sh up DIR     glusterd with its state under DIR, volume "hicachefs" with its
#                                   brick at DIR/brick, FUSE-mounted at DIR/a and DIR/b
#   scripts/glusterfs.sh down DIR   unmount both, stop the volume, stop glusterd, remove DIR
#
# Both are idempotent: each step checks what is already there. Processes are stopped by the PID
# recorded under DIR, never by name. Only one glusterd can run per machine (its bricks call it
# back on TCP port 24007, whatever port it is configured to listen on), so "up" refuses to start
# when a glusterd that is not DIR's already runs.
set -euo pipefail

usage() { echo "usage: $0 up|down DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
action=$1
dir=$(realpath -m "$2")
volume=hicachefs
host=$(hostname)  # "volume create" refuses 127.0.0.1 as a brick host, but takes this name
gluster=(timeout 60 gluster --mode=script --glusterd-sock="$dir/run/glusterd.socket" --log-file="$dir/log/cli.log")

# Alive means: the process exists and is not a zombie (killed daemons linger as zombies here,
# so kill -0 is not proof of life).
alive() {
  local state
  state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$state" ] && [ "$state" != Z ]
}

# A gluster command, retried for a few seconds: glusterd refuses commands for a moment after
# another ("Another transaction is in progress").
gluster_retried() {
  local out
  for _ in $(seq 20); do
    out=$("${gluster[@]}" "$@" 2>&1) && return 0
    sleep 0.5
  done
  echo "glusterfs.sh: gluster $*: $out" >&2
  return 1
}

glusterd_pid() {
  local pid
  pid=$(cat "$dir/glusterd.pid" 2>/dev/null) || return 1
  alive "$pid" && echo "$pid"
}

# The volume's brick processes, by the PIDs they recorded under DIR (checked against their
# command line, in case a PID was reused).
brick_pids() {
  local pidfile pid
  for pidfile in "$dir"/run/vols/"$volume"/*.pid; do
    [ -f "$pidfile" ] && pid=$(cat "$pidfile") || continue
    alive "$pid" && grep -qa -- "$dir/brick" "/proc/$pid/cmdline" && echo "$pid"
  done
  return 0
}

# Whether a mount answers within 10 s (a client reconnects to a restarted volume in about 3 s).
answers() {
  for _ in $(seq 20); do
    timeout -k 1 5 ls "$1" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  return 1
}

mounted() { awk -v m="$1" '$2 == m {found=1} END {exit !found}' /proc/self/mounts; }

start_glusterd() {
  glusterd_pid >/dev/null && return 0
  if ss -ltn 'sport = :24007' | grep -q 24007; then
    echo "glusterfs.sh: another glusterd already listens on port 24007; stop it first" >&2
    exit 1
  fi
  mkdir -p "$dir/state" "$dir/run" "$dir/log"
  sed -e "s#option working-directory .*#option working-directory $dir/state#" \
      -e "s#^end-volume#    option run-directory $dir/run\n    option glusterd-sockfile $dir/run/glusterd.socket\nend-volume#" \
      /etc/glusterfs/glusterd.vol > "$dir/glusterd.vol"
  glusterd -f "$dir/glusterd.vol" -p "$dir/glusterd.pid" -l "$dir/log/glusterd.log"
  for _ in $(seq 200); do
    "${gluster[@]}" peer status >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  echo "glusterfs.sh: glusterd did not answer within 10 s; see $dir/log/glusterd.log" >&2
  exit 1
}

up() {
  start_glusterd
  mkdir -p "$dir/brick"
  if ! "${gluster[@]}" volume info "$volume" >/dev/null 2>&1; then
    gluster_retried volume create "$volume" "$host:$dir/brick" force
  fi
  # "start force" also restarts a brick that died, and succeeds on a started volume.
  gluster_retried volume start "$volume" force
  for view in a b; do
    if mounted "$dir/$view"; then
      # A mount of a stopped volume reconnects by itself once it starts; one whose client
      # process died never does, and is replaced.
      answers "$dir/$view" && continue
      umount -l "$dir/$view"
    fi
    mkdir -p "$dir/$view"
    mount -t glusterfs -o "log-file=$dir/log/mount-$view.log" "$host:/$volume" "$dir/$view"
  done
  echo "glusterfs.sh: volume $volume up, mounted at $dir/a and $dir/b"
}

down() {
  [ -d "$dir" ] || return 0
  for view in a b; do
    mounted "$dir/$view" || continue
    timeout 30 umount "$dir/$view" 2>/dev/null || umount -l "$dir/$view"
  done
  local brick_log="/var/log/glusterfs/bricks/$(echo "${dir#/}/brick" | tr / -).log"
  local pid sockets=()
  # The bricks' sockets live in the system's run directory, named after a hash: remember them.
  for pid in $(brick_pids); do
    sockets+=($(tr '\0' '\n' < "/proc/$pid/cmdline" | grep -A1 -x -- -S | tail -n +2))
  done
  if pid=$(glusterd_pid); then
    "${gluster[@]}" volume stop "$volume" force >/dev/null 2>&1 || true
    kill "$pid"
    for _ in $(seq 200); do alive "$pid" || break; sleep 0.05; done
    alive "$pid" && kill -KILL "$pid"
  fi
  # A brick left running (glusterd died first) is stopped by the PID it recorded.
  for pid in $(brick_pids); do kill "$pid"; done
  rm -rf "$dir" "$brick_log" "${sockets[@]}"
  echo "glusterfs.sh: $dir removed"
}

case $action in
  up) up ;;
  down) down ;;
  *) usage ;;
esac
