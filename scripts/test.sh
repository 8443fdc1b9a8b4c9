#!/usr/bin/env bash
# Set up (idempotent), then run the whole test suite. CI runs exactly this.
# Without arguments, the suite in five pytest runs at once: the namespace and the store; the
# client and SGLang's own cache; operations; reliability; the shared tier's tests (on GlusterFS
# and JuiceFS volumes, mostly waiting on them). Much of the suite waits on mounts, daemons and
# timeouts: five runs keep the 2 cores busy to the end, where two left one idle for minutes.
# Each run's output is printed whole once it is done. With arguments, one run of pytest with
# them. Every run runs whatever the others did; a line for each at the end says how it went,
# and the exit status is non-zero if any failed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
cd "$root"
# --durations: the slowest tests of each run are named in its output (a run that took longer
# than usual says where).
pytest=(.venv/bin/python -m pytest -q -p no:cacheprovider --durations=8)
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# The runs: "name|pytest arguments" (arguments split at spaces).
runs=("the namespace and the store|tests/fs tests/store tests/scripts tests/test_mounting.py tests/test_name_rules.py"
      "the client and SGLang|tests/client tests/sglang"
      "operations|tests/ops"
      "reliability|tests/reliability"
      "the shared tier|tests/shared")

# run_into N RUN: run one run into log N, its name and exit status beside.
run_into() {
    local n=$1 run=$2
    # shellcheck disable=SC2086  # the arguments are split at spaces on purpose
    "${pytest[@]}" ${run#*|} > "$logs/$n.log" 2>&1 && echo 0 > "$logs/$n.status" || echo $? > "$logs/$n.status"
    echo "${run%%|*}" > "$logs/$n.name"
}

if [ $# -gt 0 ]; then
    "${pytest[@]}" "$@" && echo 0 > "$logs/0.status" || echo $? > "$logs/0.status"
    echo "pytest $*" > "$logs/0.name"
else
    for i in "${!runs[@]}"; do
        run_into "$i" "${runs[$i]}" &
    done
    wait
    for log in "$logs"/*.log; do
        echo "=== $(cat "${log%.log}.name")"
        cat "$log"
    done
fi

failed=0
names=("$logs"/*.name)
echo "test.sh: ${#names[@]} pytest run(s)"
for name in "${names[@]}"; do
    status=$(cat "${name%.name}.status")
    if [ "$status" -eq 0 ]; then
        echo "  passed: $(cat "$name")"
    else
        echo "  FAILED (exit $status): $(cat "$name")"
        failed=1
    fi
done
exit "$failed"
