"""scripts/demo.py: its page keys are SGLang's, and it runs clean on a live mount."""

from __future__ import annotations

import importlib
import random
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture
def demo(monkeypatch):
    monkeypatch.setenv("HICACHEFS_CLIENT_WITHOUT_SGLANG", "")  # the demo's default stays local
    monkeypatch.syspath_prepend(str(SCRIPTS))
    return importlib.import_module("demo")


@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_page_keys_are_sglangs(demo, page_size):
    from sglang.srt.mem_cache.utils import get_hash_str

    rng = random.Random(page_size)
    tokens = [rng.randrange(2**32) for _ in range(5 * page_size + page_size // 2)]  # + a partial page
    keys = demo.page_keys(tokens, page_size)
    assert len(keys) == 5  # full pages only: HiCache stores whole pages
    assert keys == get_hash_str(tokens[:5 * page_size], None, page_size=page_size)
    # A continuation from a parent's last key, as the radix tree chains nodes.
    assert demo.page_keys(tokens[2 * page_size:], page_size, keys[1]) == keys[2:]


def test_demo_runs_clean(demo, hicachefs_mount, capsys):
    code = demo.main(["--mountpoint", str(hicachefs_mount), "--conversations", "3", "--turns", "3",
                      "--system-prompts", "2", "--system-tokens", "512", "--user-tokens", "64",
                      "--reply-tokens", "64"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "0 with wrong bytes" in out and "client errors        none" in out
    assert "tier memory" in out
