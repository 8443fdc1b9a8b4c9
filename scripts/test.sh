#!/usr/bin/env bash
# Set up (idempotent), then run the whole test suite. CI runs exactly this.
# Without arguments, the whole suite, then a named subset (the FUSE paths of pages, ingest, fetch,
# the kernel's cache, listings, the control files) again with every mount served by 2 worker
# processes (--workers 2); with arguments, one run of pytest with them. Every run runs whatever
# the ones before it did; a line for each at the end says how it went, and the exit status is
# non-zero if any failed.
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
    run "the whole suite" "${pytest[@]}"
    # Deselected at N=2: both count a control file's requests from .hicachefs/stats, and the kernel
    # sends the RELEASE of each read of the stats file after its close; with 2 readers another
    # worker may forward it after the next read, so it lands in the count.
    run "a subset with --workers 2" env HICACHEFS_TEST_WORKERS=2 "${pytest[@]}" \
        tests/fs/test_page_files.py tests/fs/test_ingest.py tests/fs/test_fetch.py \
        tests/fs/test_kernel_cache.py tests/fs/test_many_threads.py tests/fs/test_names.py \
        tests/fs/test_shell_tools.py tests/fs/test_control_files.py \
        --deselect tests/fs/test_fetch.py::test_a_batch_is_read_back_to_back_in_as_few_reads_as_its_bytes_need \
        --deselect tests/fs/test_ingest.py::test_a_batch_publishes_every_page_whole_in_few_requests
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
