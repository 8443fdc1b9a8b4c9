#!/usr/bin/env bash
# Set up (idempotent), then run the whole test suite. CI runs exactly this.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
cd "$root"
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
