"""Copies between a mapping and a page's pieces (``client/vectored.py``): every byte lands, and
which pieces are copied holding the interpreter lock (a batch copied in one run holds it for
larger pieces: no other page thread waits for it)."""

from __future__ import annotations

import mmap

import pytest

from hicachefs_client import vectored


@pytest.fixture
def held(monkeypatch):
    """The sizes copied holding the lock, in order."""
    sizes = []
    holding = vectored._memmove_holding_lock

    def counted(target, source, size):
        sizes.append(size)
        return holding(target, source, size)

    monkeypatch.setattr(vectored, "_memmove_holding_lock", counted)
    return sizes


@pytest.mark.parametrize("alone, expected", [(False, [64 << 10]), (True, [64 << 10, 384 << 10, 512 << 10])])
def test_pieces_copied_holding_the_lock_depend_on_the_batch_being_one_run(held, alone, expected):
    area = mmap.mmap(-1, 1 << 20)
    view = memoryview(area)
    view[:] = bytes(range(256)) * 4096
    pieces = [bytearray(64 << 10), bytearray(384 << 10), bytearray(512 << 10)]
    done = vectored.copy_from(view, vectored.address_of(view), [memoryview(p) for p in pieces], 0, alone=alone)
    assert done == 960 << 10 and b"".join(pieces) == bytes(view[: 960 << 10])
    assert held == expected  # one run: pieces under 1 MiB hold it; several: under 256 KiB only
    view.release()
    area.close()
