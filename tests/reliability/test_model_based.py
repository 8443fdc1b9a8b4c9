"""Hypothesis stateful test: random sequences of namespace and page operations, eviction
pressure and remounts, run against a real mount and against a small model; every answer
agrees. Eviction and remounts may make pages disappear (the model marks them "may be
gone"), but a page that is there always has exactly the bytes last published under it."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from hicachefs.testing import mounting
from workload import content, exists_query, page_files, publish, read_or_errno

MODELS = ["m1", "m2"]
POOLS = [("f", "tp0of1", "kv"), ("f", "all", "kv"), ("g", "tp0of2", "mamba")]
KEYS = ["a", "b", "c", "d"]
FLAGS = ["--memory", "16M", "--max-page-size", "2M"]


class MountModel(RuleBasedStateMachine):
    """The model: directories that exist, and pages as (bytes, sure) where ``sure`` is False
    once eviction pressure or a remount may have taken the page."""

    def __init__(self):
        super().__init__()
        self.work = Path(tempfile.mkdtemp(prefix="hicachefs-model-"))
        self.flags = [*FLAGS, "--disk", str(self.work / "disk"), "--disk-size", "48M"]
        self.mounts = [mounting.start(self.work / "mnt", self.work / "daemon0.log", self.flags)]
        self.dirs: set[tuple[str, ...]] = set()
        self.pages: dict[tuple[str, ...], tuple[bytes, bool]] = {}
        self.version = 0

    @property
    def root(self) -> Path:
        return self.mounts[-1].path

    def teardown(self):
        failures = []
        for mount in self.mounts:
            mounting.stop(mount)
            failures += mounting.unexpected_log_lines(mount)
        shutil.rmtree(self.work, ignore_errors=True)
        assert not failures, "the daemon logged errors:\n" + "\n".join(failures)

    # ---- helpers ----------------------------------------------------------------------

    def _path(self, parts) -> Path:
        return self.root.joinpath(*parts)

    def _forget_under(self, prefix: tuple[str, ...]) -> None:
        for d in [d for d in self.dirs if d[: len(prefix)] == prefix]:
            self.dirs.discard(d)
        for p in [p for p in self.pages if p[: len(prefix)] == prefix]:
            del self.pages[p]

    def _check_page(self, parts, got) -> None:
        expected = self.pages.get(parts)
        if expected is None:
            assert got == errno.ENOENT, f"{'/'.join(parts)}: absent in the model, mount answered {got!r:.80}"
        elif isinstance(got, int):
            assert got == errno.ENOENT and not expected[1], \
                f"{'/'.join(parts)}: {errno.errorcode.get(got, got)} for a page that must be there"
            del self.pages[parts]  # gone legitimately: evicted
        else:
            assert got == expected[0], f"{'/'.join(parts)}: wrong bytes ({len(got)} vs {len(expected[0])})"

    # ---- rules --------------------------------------------------------------------------

    @rule(model=st.sampled_from(MODELS), pool=st.sampled_from(POOLS), depth=st.integers(1, 4))
    def mkdir(self, model, pool, depth):
        parts = (model, *pool)[:depth]
        try:
            os.mkdir(self._path(parts))
            got = 0
        except OSError as exc:
            got = exc.errno
        if parts in self.dirs:
            assert got == errno.EEXIST
        elif depth > 1 and parts[:-1] not in self.dirs:
            assert got == errno.ENOENT
        else:
            assert got == 0, f"mkdir {'/'.join(parts)}: {errno.errorcode.get(got)}"
            self.dirs.add(parts)

    @rule(model=st.sampled_from(MODELS), pool=st.sampled_from(POOLS), key=st.sampled_from(KEYS),
          size=st.sampled_from([0, 1, 100, 4096, 70_000, 1 << 20]))
    def publish_page(self, model, pool, key, size):
        pool_parts = (model, *pool)
        self.version += 1
        data = content(key, size, gen=self.version)
        try:
            publish(self._path(pool_parts), key, data)
            got = 0
        except OSError as exc:
            got = exc.errno
        if pool_parts not in self.dirs:
            assert got == errno.ENOENT
        else:
            assert got == 0, f"publish: {errno.errorcode.get(got)}"
            self.pages[(*pool_parts, key)] = (data, True)

    @precondition(lambda self: self.pages)
    @rule(data=st.data())
    def read_known(self, data):
        parts = data.draw(st.sampled_from(sorted(self.pages)))
        self._check_page(parts, read_or_errno(self._path(parts)))

    @rule(model=st.sampled_from(MODELS), pool=st.sampled_from(POOLS), key=st.sampled_from(KEYS))
    def read_any(self, model, pool, key):
        parts = (model, *pool, key)
        self._check_page(parts, read_or_errno(self._path(parts)))

    @precondition(lambda self: self.pages)
    @rule(data=st.data())
    def stat_page(self, data):
        parts = data.draw(st.sampled_from(sorted(self.pages)))
        expected, sure = self.pages[parts]
        try:
            st_ = os.stat(self._path(parts))
        except FileNotFoundError:
            assert not sure, f"stat {'/'.join(parts)}: ENOENT for a page that must be there"
            del self.pages[parts]
            return
        assert st_.st_size == len(expected) and st_.st_mode & 0o777 == 0o444

    @precondition(lambda self: self.pages)
    @rule(data=st.data())
    def unlink(self, data):
        parts = data.draw(st.sampled_from(sorted(self.pages)))
        sure = self.pages.pop(parts)[1]
        try:
            os.unlink(self._path(parts))
        except FileNotFoundError:
            assert not sure, f"unlink {'/'.join(parts)}: ENOENT for a page that must be there"
        assert not os.path.lexists(self._path(parts))

    @precondition(lambda self: self.pages)
    @rule(data=st.data(), key=st.sampled_from(KEYS))
    def rename(self, data, key):
        source = data.draw(st.sampled_from(sorted(self.pages)))
        pools = sorted(d for d in self.dirs if len(d) == 4)
        target = (*data.draw(st.sampled_from(pools)), key)
        if target == source:
            return
        page, sure = self.pages[source]
        try:
            os.rename(self._path(source), self._path(target))
        except FileNotFoundError:
            assert not sure, f"rename {'/'.join(source)}: ENOENT for a page that must be there"
            del self.pages[source]
            return
        del self.pages[source]
        self.pages[target] = (page, True)

    @precondition(lambda self: self.dirs)
    @rule(data=st.data())
    def rm_r(self, data):
        parts = data.draw(st.sampled_from(sorted(self.dirs)))
        shutil.rmtree(self._path(parts))
        assert not os.path.lexists(self._path(parts))
        self._forget_under(parts)

    @rule(extra=st.lists(st.sampled_from(KEYS + ["zz", "not-there"]), max_size=4))
    def exists(self, extra):
        candidates = sorted(self.pages) + [(m, *p, k) for m in MODELS[:1] for p in POOLS[:1] for k in extra]
        answer = exists_query(self.root, ["/".join(c) for c in candidates])
        assert len(answer) == len(candidates)
        for parts, bit in zip(candidates, answer):
            known = self.pages.get(parts)
            if known is None:
                assert bit == "0", f"exists says {'/'.join(parts)} is there; the model has no such page"
            elif known[1]:
                assert bit == "1", f"exists says {'/'.join(parts)} is missing; it must be there"

    @rule()
    def eviction_pressure(self):
        pool = self.root / "pressure" / "f" / "tp0of1" / "kv"
        pool.mkdir(parents=True, exist_ok=True)
        for i in range(40):  # 80 MiB through 16 MiB of RAM and 48 MiB of disk
            publish(pool, f"p{i}", b"\xa5" * (2 << 20))
        shutil.rmtree(self.root / "pressure")
        self.pages = {p: (d, False) for p, (d, _) in self.pages.items()}

    @rule()
    def remount(self):
        mounting.stop(self.mounts[-1])
        self.mounts.append(mounting.start(self.work / "mnt", self.work / f"daemon{len(self.mounts)}.log", self.flags))
        self.pages = {p: (d, False) for p, (d, _) in self.pages.items()}
        # What came back: every page the mount lists must be the model's, byte for byte;
        # directories without pages need not survive a restart.
        listed = {tuple(rel.split("/")) for rel in page_files(self.root)}
        for parts in listed:
            assert parts in self.pages, f"{'/'.join(parts)} came back after a remount; it was never published"
        for parts in list(self.pages):
            if parts in listed:
                self._check_page(parts, read_or_errno(self._path(parts)))
            else:
                del self.pages[parts]
        self.dirs = {d for d in self.dirs if self._path(d).is_dir()}

    @invariant()
    def listings_agree(self):
        for d in sorted(self.dirs):
            if len(d) != 4:
                continue
            names = set(os.listdir(self._path(d)))
            sure = {p[-1] for p, (_, s) in self.pages.items() if p[:4] == d and s}
            maybe = {p[-1] for p in self.pages if p[:4] == d}
            assert sure <= names <= maybe, f"{'/'.join(d)} lists {sorted(names)}; model {sorted(sure)}..{sorted(maybe)}"


MountModel.TestCase.settings = settings(
    max_examples=int(os.environ.get("HICACHEFS_MODEL_EXAMPLES", "5")),
    stateful_step_count=int(os.environ.get("HICACHEFS_MODEL_STEPS", "25")),
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=os.environ.get("HICACHEFS_MODEL_RANDOM") is None,
)
TestMountModel = MountModel.TestCase
