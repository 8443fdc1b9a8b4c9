"""scripts/demo.py: SGLang's own radix cache and cache controller serve its turns over a live
mount, clean (no wrong byte, no failed call), and what it shows happens: with a RAM tier smaller
than the workload, pages are demoted to disk and promoted back; after a warm restart SGLang finds
every page it asks hicachefs for, from disk; and SGLang's storage metrics count the traffic."""

from __future__ import annotations

import pytest

from hicachefs_testing import mounting

#: 31 pages of 768 KiB (23 MiB): more than a 16 MiB RAM tier holds.
SMALL = dict(conversations=3, turns=3, system_prompts=2, system_tokens=512, user_tokens=64, reply_tokens=64)


def small_args() -> list[str]:
    return [f"--{name.replace('_', '-')}={value}" for name, value in SMALL.items()]


def test_demo_runs_clean_moves_pages_between_tiers_and_hits_from_disk_after_a_warm_restart(
        demo, mount_factory, tmp_path, capsys):
    from lib.demo_workload import Workload

    flags = ("--memory", "16M", "--disk", str(tmp_path / "disk"), "--disk-size", "64M")
    first = mount_factory(*flags)
    assert demo.main(["serve", str(first.path), *small_args()]) == 0
    out = capsys.readouterr().out
    assert "0 with wrong bytes" in out and "client errors        none" in out
    workload = Workload(**SMALL)
    stored = workload.pages_stored()
    assert f"pages stored         {stored} new" in out
    assert first.stats()["tiers"]["memory"]["pages"] + first.stats()["tiers"]["disk"]["pages"] >= stored
    assert "tokens prefetched" in out and f"{stored * workload.page_size} backed up" in out
    memory = first.stats()["tiers"]["memory"]
    assert memory["demotions"] > 0  # RAM overflowed to disk (promotions follow after the restart)
    assert "demoted from memory" in out

    mounting.stop(first)  # SIGTERM, as hicachefs umount: the RAM tier is written down
    again = mount_factory(*flags, path=first.path)
    assert again.stats()["tiers"]["disk"]["pages"] == stored
    second = demo.serve(str(again.path), workload, show_top=True)
    out = capsys.readouterr().out
    assert second.ok
    # A fresh server: SGLang's device and host pools start empty, and it finds every page it asks for.
    assert second.tally.wanted > 0 and second.tally.loaded == second.tally.wanted and second.tally.stored == 0
    assert second.tiers["disk"]["hits"] > 0  # from disk: RAM started empty
    assert sum(tier["hits"] for tier in second.tiers.values()) == second.tally.loaded
    assert "hit rate 100.0%" in out
    assert second.metrics["sglang:prefetched_tokens_total"] == second.tally.loaded * workload.page_size
    assert f"hicachefs top {again.path}" in out and "errors: none" in out  # top's view was shown


def test_demo_refuses_a_directory_that_is_not_a_mount(demo, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        demo.main(["serve", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "is not a live hicachefs mount" in capsys.readouterr().err


def test_two_hosts_needs_shared_tiers(demo, mount_factory, capsys):
    a, b = mount_factory("--memory", "16M"), mount_factory("--memory", "16M")
    with pytest.raises(SystemExit):
        demo.main(["two-hosts", str(a.path), str(b.path)])
    assert "has no shared tier: mount it with --shared" in capsys.readouterr().err
