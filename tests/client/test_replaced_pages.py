"""Pages another process replaces over and over are never read old once its last replace was
answered: through the data plane (whose reads check the row they copied from), and through the
control files (the daemon answers an ingest write only once the kernel knows what it replaced)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from hicachefs_testing.host_pools import MHAHostPool, page_bytes
from hicachefs_testing.workload import content
from test_backend import indices, key, make_fs

PAGES = 8


@pytest.mark.parametrize("plane", [True, False], ids=["plane", "no-plane"])
@pytest.mark.parametrize("how", ["ingest", "rename"])
def test_pages_another_process_replaced_are_never_read_old_once_it_stopped(mounted, how, plane):
    """While another process replaces 8 pages over and over, reads race the replaces. Once the
    writer's last replace has been answered, every read gives that last version."""
    pool = MHAHostPool(pages=PAGES)
    reader = make_fs(mounted.path, pool, extra={"data_plane": plane})
    keys = [key("replaced", i) for i in range(PAGES)]
    size = reader._layout("kv").page_bytes
    directory = reader._dir_of("kv")
    (mounted.path / directory).mkdir(parents=True, exist_ok=True)
    writer = subprocess.Popen([sys.executable, "-m", "hicachefs_testing.replacer", str(mounted.path), directory,
                               ",".join(keys), str(size), "2", how], stdout=subprocess.PIPE, text=True)
    try:
        while writer.poll() is None:  # reads (and keeps) while the pages change under them
            reader.batch_get_v1(keys, indices(pool, range(PAGES)))
        last = int(writer.stdout.read())
    finally:
        writer.kill()
        writer.wait()
    assert writer.returncode == 0
    newest = [content(last * PAGES + i, size) for i in range(PAGES)]
    old = reads = 0
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        pool.zero()
        assert reader.batch_get_v1(keys, indices(pool, range(PAGES))) == [True] * PAGES
        old += sum(page_bytes(pool, i) != newest[i] for i in range(PAGES))
        reads += PAGES
    reader.close()
    assert old == 0, f"{old} of {reads} reads gave a version older than the last one published"
