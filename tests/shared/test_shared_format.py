"""The shared tier's page file format and directory layout."""

import collections
import struct

import pytest
from shared_helpers import POOL, make_page, page_name

from hicachefs.store.shared import format as page_format
from hicachefs.store.shared.layout import Layout, page_name as name_of_file, place
from hicachefs.store.pages import PageMeta


@pytest.mark.parametrize("name", [page_name(1), "m/f/s/p/ключ-ü", "flat-key", f"{POOL}/{'k' * 200}"])
def test_header_round_trip(name):
    page = PageMeta(name, 12345, 0xDEADBEEF12345678, 1_700_000_000_123_456_789)
    head = page_format.encode(page)
    assert len(head) == page_format.header_length(name)
    decoded = page_format.decode(head + b"payload", name)
    assert decoded.verdict is page_format.Verdict.OK
    assert decoded.page == page and decoded.payload_offset == len(head)


def test_every_flipped_header_bit_is_caught():
    page, _ = make_page(7)
    head = page_format.encode(page)
    for bit in range(len(head) * 8):
        damaged = bytearray(head)
        damaged[bit // 8] ^= 1 << (bit % 8)
        verdict = page_format.decode(bytes(damaged), page.name).verdict
        # A flip in the magic reads as no page file, in the version field as another version:
        # neither served nor removed.
        expected = (page_format.Verdict.STRANGER if bit < 32 else
                    page_format.Verdict.FOREIGN if bit < 48 else page_format.Verdict.CORRUPT)
        assert verdict is expected, f"bit {bit}"


def test_short_headers_and_other_pages_files_are_corrupt():
    """A page file cut short is damaged, even below the magic's 4 bytes (no other data's file
    lies where a page's name hashes to and is that short)."""
    page, _ = make_page(1)
    head = page_format.encode(page)
    for length in (0, 2, 3, 4, 10, page_format.HEADER_BYTES, len(head) - 1):
        assert page_format.decode(head[:length], page.name).verdict is page_format.Verdict.CORRUPT
    other, _ = make_page(2)
    assert page_format.decode(head, other.name).verdict is page_format.Verdict.CORRUPT


def test_files_without_the_magic_are_no_page_files():
    page, _ = make_page(1)
    for data in (b"HCs!", b"operator data, not a page\n" * 100, b"hcsp" + page_format.encode(page)[4:]):
        assert page_format.decode(data, page.name).verdict is page_format.Verdict.STRANGER


def test_another_format_version_is_foreign():
    page, _ = make_page(1)
    head = bytearray(page_format.encode(page))
    struct.pack_into("<H", head, 4, page_format.VERSION + 1)
    assert page_format.decode(bytes(head), page.name).verdict is page_format.Verdict.FOREIGN


def test_path_mirrors_the_namespace_then_one_fanout_directory(tmp_path):
    name = page_name(3)
    where = place(name)
    path = Layout(tmp_path).page_path(where)
    relative = path[len(str(tmp_path)) + 1 :].split("/")
    assert relative[:4] == POOL.split("/") and relative[5] == name.rsplit("/", 1)[1]
    assert len(relative[4]) == 2 and int(relative[4], 16) == where.key_hash >> 56
    assert name_of_file(where.directory, where.key) == name
    assert name_of_file(where.directory, "." + where.key) is None  # temporary files are not pages
    assert name_of_file(POOL + "/zz", where.key) is None  # nor files in the wrong directory


def test_fanout_spreads_any_keys_evenly():
    counts = collections.Counter(place(f"{POOL}/page-{i}").directory for i in range(256 * 200))
    assert len(counts) == 256
    assert min(counts.values()) > 200 * 0.7 and max(counts.values()) < 200 * 1.3
