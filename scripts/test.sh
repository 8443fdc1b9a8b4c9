#!/usr/bin/env bash
# Set up (idempotent), then run the whole test suite. CI runs exactly this.
# Without arguments, the suite in two runs: everything but the shared tier's engines, then the
# shared tier's tests (on GlusterFS and JuiceFS volumes); with arguments, one run of pytest with
# them. Every run runs whatever the ones before it did; a line for each at the end says how it
# went, and the exit status is non-zero if any failed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
cd "$root"
pytest=(.venv/bin/python -m pytest -q -p no:cacheprovider)

run_names=()
run_statuses=()

# run NAME COMMAND...: run one, and keep its exit status for the summary.
run() {
    local name=$1 status=0
    shift
    "$@" || status=$?
    run_names+=("$name")
    run_statuses+=("$status")
}

# The runs, in one place.
runs() {
    if [ $# -gt 0 ]; then
        run "pytest $*" "${pytest[@]}" "$@"
        return
    fi
    run "all but the shared tier" "${pytest[@]}" --ignore=tests/shared
    run "the shared tier" "${pytest[@]}" tests/shared
}

runs "$@"
failed=0
echo "test.sh: ${#run_names[@]} pytest run(s)"
for i in "${!run_names[@]}"; do
    if [ "${run_statuses[$i]}" -eq 0 ]; then
        echo "  passed: ${run_names[$i]}"
    else
        echo "  FAILED (exit ${run_statuses[$i]}): ${run_names[$i]}"
        failed=1
    fi
done
exit "$failed"
