#!/usr/bin/env bash
# Idempotent set-up of a fresh Debian machine: OS packages, .venv, the project and its test extras.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

# Debian's own Python 3.11: built with PGO and LTO, it runs the daemon's per-request Python
# about 1.5x faster than an unoptimised build (such as a default pyenv one).
py=/usr/bin/python3.11
# One package per line.
os_pkgs=(
  fuse3
  libfuse3-dev
  pkg-config
  attr
  fio
  python3.11
  python3.11-venv
  python3.11-dev
  glusterfs-server  # the shared tier's tests and benchmark run on a real GlusterFS volume
  glusterfs-client
)
need_pkgs=()
for p in "${os_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need_pkgs+=("$p")
done
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "setup: installing OS packages: ${need_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

if [ -f .venv/pyvenv.cfg ] && ! grep -qx "home = $(dirname "$py")" .venv/pyvenv.cfg; then
  echo "setup: .venv was made by another Python; making it again with $py"
  rm -rf .venv
fi
[ -x .venv/bin/python ] || "$py" -m venv .venv
pip=(.venv/bin/python -m pip -q --disable-pip-version-check)

stamp=.venv/.hicachefs-setup
want=$(cat pyproject.toml scripts/setup.sh scripts/sglang-requirements.txt | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "setup: installing Python packages into .venv"
# torch first, pinned to this machine's local CPU build, so nothing pulls a CUDA build.
"${pip[@]}" install torch==2.13.0
"${pip[@]}" install -e ".[test]"
# SGLang only for tests and benchmarks: its storage modules, without its serving stack.
"${pip[@]}" install --no-deps sglang==0.5.23
"${pip[@]}" install -r scripts/sglang-requirements.txt
echo "$want" > "$stamp"
echo "setup: done"
