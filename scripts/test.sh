#!/usr/bin/env bash
# Set up (idempotent), then run the whole test suite. CI runs exactly this.
# Without arguments, the suite in four pytest runs on two lanes at once: the namespace, the store
# and SGLang's own cache, then the shared tier's tests (on GlusterFS and JuiceFS volumes), on one
# lane; the client, then operations and reliability, on the other (about 6 minutes each
# here: much of the suite waits on mounts, daemons and timeouts, so two lanes keep the 2 cores
# busy; whole directories, split so that the lanes take about as long). Each run's output is
# printed whole once its lane is done. With arguments, one run of pytest with them. Every run
# runs whatever the others did; a line for each at the end says how it went, and the exit
# status is non-zero if any failed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
cd "$root"
# --durations: the slowest tests of each run are named in its output (the suite runs near its
# time limit on 2 cores; a run that took longer says where).
pytest=(.venv/bin/python -m pytest -q -p no:cacheprovider --durations=8)
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# The runs, by lane: "name|pytest arguments" (arguments split at spaces).
lane_a=("the namespace, the store and SGLang's cache|tests/fs tests/store tests/sglang tests/test_mounting.py tests/test_name_rules.py"
        "the shared tier|tests/shared")
lane_b=("the client|tests/client tests/scripts"
        "operations and reliability|tests/ops tests/reliability")

# lane N RUN...: run a lane's runs one after the other, each into its log, its exit status beside.
lane() {
    local n=$1 i=0 run
    shift
    for run in "$@"; do
        # shellcheck disable=SC2086  # the arguments are split at spaces on purpose
        "${pytest[@]}" ${run#*|} > "$logs/$n.$i.log" 2>&1 && echo 0 > "$logs/$n.$i.status" \
            || echo $? > "$logs/$n.$i.status"
        echo "${run%%|*}" > "$logs/$n.$i.name"
        i=$((i + 1))
    done
}

if [ $# -gt 0 ]; then
    "${pytest[@]}" "$@" && echo 0 > "$logs/a.0.status" || echo $? > "$logs/a.0.status"
    echo "pytest $*" > "$logs/a.0.name"
else
    lane a "${lane_a[@]}" &
    lane b "${lane_b[@]}" &
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
