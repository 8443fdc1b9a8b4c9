#!/usr/bin/env bash
# Set up (idempotent), then run the whole test suite. CI runs exactly this.
# Without arguments, a named subset (the FUSE paths of pages, ingest, fetch, the kernel's cache,
# listings, the control files) then runs again with every mount served by 2 worker processes (--workers 2).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
cd "$root"
pytest=(.venv/bin/python -m pytest -q -p no:cacheprovider)
if [ $# -gt 0 ]; then
    exec "${pytest[@]}" "$@"
fi
"${pytest[@]}"
# Deselected at N=2: both count a control file's requests from .hicachefs/stats, and the kernel
# sends the RELEASE of each read of the stats file after its close; with 2 readers another
# worker may forward it after the next read, so it lands in the count.
HICACHEFS_TEST_WORKERS=2 exec "${pytest[@]}" \
    tests/fs/test_page_files.py tests/fs/test_ingest.py tests/fs/test_fetch.py \
    tests/fs/test_kernel_cache.py tests/fs/test_many_threads.py tests/fs/test_names.py \
    tests/fs/test_shell_tools.py tests/fs/test_control_files.py \
    --deselect tests/fs/test_fetch.py::test_a_batch_is_read_back_to_back_in_as_few_reads_as_its_bytes_need \
    --deselect tests/fs/test_ingest.py::test_a_batch_publishes_every_page_whole_in_few_requests
