"""A Hypothesis state machine: random sequences of namespace and page operations, eviction
pressure and remounts, run against a real mount and against a small model; every answer
agrees. Eviction and remounts may make pages disappear (the model marks them "may be
gone"), but a page that is there always has exactly the bytes last published under it.

Run by ``tests/reliability/test_model_based.py`` and, for tens of thousands of steps, by
``scripts/stress.py``. Every step is counted (``MountModel.steps_run``) and traced: a failing
step writes the steps of its run and the error to ``MountModel.record_to``, so a failure is
kept even when Hypothesis cannot replay it (eviction depends on timing: pages the kernel is
being given are pinned, so a replay may draw from other pages and report only
``FlakyStrategyDefinition``).
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
import tempfile
import time
import traceback
from pathlib import Path

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from hicachefs_testing import mounting
from hicachefs_testing.workload import exists_query, labelled_content, page_files, publish, read_or_errno

MODELS = ["m1", "m2"]
POOLS = [("f", "tp0of1", "kv"), ("f", "all", "kv"), ("g", "tp0of2", "mamba")]
KEYS = ["a", "b", "c", "d"]
FLAGS = ["--memory", "16M", "--max-page-size", "2M"]


def _traced(method):
    """Count and trace a rule's step; record the run if it fails."""

    @functools.wraps(method)
    def traced(self, **kwargs):
        self.trace.append(f"{method.__name__}({', '.join(f'{k}={v!r:.60}' for k, v in kwargs.items())})")
        MountModel.steps_run += 1
        self.steps += 1
        started = time.monotonic()
        try:
            return method(self, **kwargs)
        except BaseException:
            self.record(traceback.format_exc())
            raise
        finally:
            self.trace[-1] += f" [{time.monotonic() - started:.3f} s]"

    return traced


def _traced_check(method):
    """Record the run if an invariant fails."""

    @functools.wraps(method)
    def checked(self):
        try:
            return method(self)
        except BaseException:
            self.record(f"after the last step, {method.__name__}:\n" + traceback.format_exc())
            raise

    return checked


class MountModel(RuleBasedStateMachine):
    """The model: directories that exist, and pages as (bytes, sure) where ``sure`` is False
    once eviction pressure or a remount may have taken the page."""

    steps_run = 0  # rule steps run, over every instance
    record_to: Path | None = None  # where a failing run's steps and error are appended
    # Steps between remounts and between bursts of eviction pressure, at least: they cost about
    # a second and a fifth of one, the other steps a few milliseconds.
    remount_every = 20
    pressure_every = 8

    def __init__(self):
        super().__init__()
        self.trace: list[str] = []
        self.failed = False
        self.steps = 0
        self.last_remount = self.last_pressure = 0
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
        if failures:
            self.record("the daemon logged errors:\n" + "\n".join(failures))
        if not self.failed:
            shutil.rmtree(self.work, ignore_errors=True)  # kept, with its logs, when something failed
        assert not failures, "the daemon logged errors:\n" + "\n".join(failures)

    def record(self, error: str) -> None:
        """Append this run's steps, the error and the end of each daemon's log to ``record_to``."""
        self.failed = True
        if self.record_to is None:
            return
        with open(self.record_to, "a") as out:
            out.write(f"--- a run of {len(self.trace)} steps failed (work directory {self.work})\n")
            out.write("\n".join(self.trace) + "\n" + error + "\n")
            for mount in self.mounts:
                tail = mount.log_text().splitlines()[-15:]
                out.write(f"    end of {mount.log_file}:\n" + "".join(f"    {line}\n" for line in tail))

    def _pick(self, data, items):
        """One of ``items``, noted in the trace. Hypothesis draws a number, not an item: which
        pages the model holds depends on eviction, which depends on timing, and a draw that
        depended on them could not be replayed (FlakyStrategyDefinition, hiding the error)."""
        choice = sorted(items)[data.draw(st.integers(0, 1 << 16)) % len(items)]
        self.trace[-1] += f" -> {choice!r:.80}"
        return choice

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

    @initialize(pools=st.lists(st.tuples(st.sampled_from(MODELS), st.sampled_from(POOLS)), min_size=1,
                               max_size=3, unique=True))
    @_traced
    def make_pools(self, pools):
        """Start with a few pool directories, so that every run publishes and reads pages."""
        for model, pool in pools:
            parts = (model, *pool)
            os.makedirs(self._path(parts), exist_ok=True)
            self.dirs.update(parts[:depth] for depth in range(1, 5))

    @rule(model=st.sampled_from(MODELS), pool=st.sampled_from(POOLS), depth=st.integers(1, 4))
    @_traced
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
    @_traced
    def publish_page(self, model, pool, key, size):
        pool_parts = (model, *pool)
        self.version += 1
        data = labelled_content(key, size, gen=self.version)
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
    @_traced
    def read_known(self, data):
        parts = self._pick(data, self.pages)
        self._check_page(parts, read_or_errno(self._path(parts)))

    @rule(model=st.sampled_from(MODELS), pool=st.sampled_from(POOLS), key=st.sampled_from(KEYS))
    @_traced
    def read_any(self, model, pool, key):
        parts = (model, *pool, key)
        self._check_page(parts, read_or_errno(self._path(parts)))

    @precondition(lambda self: self.pages)
    @rule(data=st.data())
    @_traced
    def stat_page(self, data):
        parts = self._pick(data, self.pages)
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
    @_traced
    def unlink(self, data):
        parts = self._pick(data, self.pages)
        sure = self.pages.pop(parts)[1]
        try:
            os.unlink(self._path(parts))
        except FileNotFoundError:
            assert not sure, f"unlink {'/'.join(parts)}: ENOENT for a page that must be there"
        assert not os.path.lexists(self._path(parts))

    @precondition(lambda self: self.pages)
    @rule(data=st.data(), key=st.sampled_from(KEYS))
    @_traced
    def rename(self, data, key):
        source = self._pick(data, self.pages)
        pools = sorted(d for d in self.dirs if len(d) == 4)
        target = (*self._pick(data, pools), key)
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
    @_traced
    def rm_r(self, data):
        parts = self._pick(data, self.dirs)
        shutil.rmtree(self._path(parts))
        assert not os.path.lexists(self._path(parts))
        self._forget_under(parts)

    @rule(extra=st.lists(st.sampled_from(KEYS + ["zz", "not-there"]), max_size=4))
    @_traced
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

    @precondition(lambda self: self.steps - self.last_pressure >= self.pressure_every)
    @rule()
    @_traced
    def eviction_pressure(self):
        self.last_pressure = self.steps
        pool = self.root / "pressure" / "f" / "tp0of1" / "kv"
        pool.mkdir(parents=True, exist_ok=True)
        for i in range(40):  # 80 MiB through 16 MiB of RAM and 48 MiB of disk
            publish(pool, f"p{i}", b"\xa5" * (2 << 20))
        shutil.rmtree(self.root / "pressure")
        self.pages = {p: (d, False) for p, (d, _) in self.pages.items()}

    @precondition(lambda self: self.steps - self.last_remount >= self.remount_every)
    @rule()
    @_traced
    def remount(self):
        self.last_remount = self.steps
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
    @_traced_check
    def listings_agree(self):
        for d in sorted(self.dirs):
            if len(d) != 4:
                continue
            names = set(os.listdir(self._path(d)))
            sure = {p[-1] for p, (_, s) in self.pages.items() if p[:4] == d and s}
            maybe = {p[-1] for p in self.pages if p[:4] == d}
            assert sure <= names <= maybe, f"{'/'.join(d)} lists {sorted(names)}; model {sorted(sure)}..{sorted(maybe)}"


def model_settings(examples: int, steps: int, derandomize: bool = True) -> settings:
    """How long the machine runs: ``examples`` fresh mounts of up to ``steps`` steps each."""
    return settings(max_examples=examples, stateful_step_count=steps, deadline=None,
                    suppress_health_check=list(HealthCheck), derandomize=derandomize, database=None)


def run_seeded(seed: int, examples: int, steps: int) -> tuple[int, str | None]:
    """Run the machine from Hypothesis seed ``seed``, generating only (no shrinking: a failure
    is reported as found, and recorded with its steps). Returns (steps run, the error or None)."""
    from hypothesis import Phase
    from hypothesis import seed as with_seed
    from hypothesis.stateful import run_state_machine_as_test

    machine = with_seed(seed)(type(f"MountModelSeed{seed}", (MountModel,), {}))
    before = MountModel.steps_run
    try:
        run_state_machine_as_test(machine, settings=settings(model_settings(examples, steps, derandomize=False),
                                                             phases=[Phase.generate]))
    except Exception as exc:  # a divergence, or the daemon logged an error: reported, not raised
        return MountModel.steps_run - before, f"{type(exc).__name__}: {exc}"
    return MountModel.steps_run - before, None
