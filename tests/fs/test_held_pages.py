"""Pages other users hold open never keep new pages out of RAM nor make writes fail
(issue 20, item 11): a plain user who opens every new page and keeps reading it (``O_DIRECT``, so
every read reaches the daemon and renews its pin's lease) holds at most a quarter of the RAM tier
pinned; the rest of its pages are demoted to the disk tier, where its reads still find them."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess

from hicachefs_testing import attacks
from hicachefs_testing.workload import content
from pages import publish

MiB = 1 << 20

#: Run as nobody with the system's Python: "open K1 K2..." opens those pages (O_DIRECT) and reads
#: a block of each; "renew" reads a block of every page it holds; "check" reads each whole and
#: prints their sha256 by key (or the read's error, as "EIO"). Each command is answered with one line.
HOLDER = r"""
import errno, hashlib, json, mmap, os, sys
pool = sys.argv[1]
held = {}
block = mmap.mmap(-1, 1 << 20)  # page-aligned, as O_DIRECT needs

def read_block(fd, offset=0):
    return os.preadv(fd, [memoryview(block)[:4096]], offset)

for line in sys.stdin:
    command, *keys = line.split()
    if command == "open":
        for key in keys:
            held[key] = os.open(os.path.join(pool, key), os.O_RDONLY | os.O_DIRECT)
            read_block(held[key])
        print("ok", flush=True)
    elif command == "renew":
        for fd in held.values():
            read_block(fd)
        print("ok", flush=True)
    elif command == "check":
        sums = {}
        for key, fd in held.items():
            digest, offset = hashlib.sha256(), 0
            try:
                while done := os.preadv(fd, [block], offset):
                    digest.update(block[:done])
                    offset += done
            except OSError as exc:
                sums[key] = errno.errorcode[exc.errno]
                continue
            sums[key] = digest.hexdigest()
        print(json.dumps(sums), flush=True)
"""


def start_holder(pool) -> subprocess.Popen:
    """The HOLDER script run as nobody."""
    return subprocess.Popen(["/usr/bin/python3.11", "-c", HOLDER, str(pool)], user=65534, group=65534,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def ask(holder: subprocess.Popen, command: str) -> str:
    holder.stdin.write(command + "\n")
    holder.stdin.flush()
    return holder.stdout.readline().strip()


def test_a_plain_user_holding_and_reading_every_new_page_keeps_no_new_page_out_of_ram(public_mount_factory, tmp_path):
    mount = public_mount_factory("--memory", "64M", "--disk", str(tmp_path / "disk"), "--disk-size", "1G")
    pool = mount.page_dir()
    holder = start_holder(pool)
    pages, in_ram, refused = {}, [], 0
    try:
        for round_ in range(4):  # 40 MiB a round through a 64 MiB RAM tier
            keys = [f"r{round_}-{i}" for i in range(40)]
            placed = 0
            for key in keys:
                pages[key] = content(key, MiB)
                try:
                    publish(pool, key, pages[key])
                except OSError:
                    refused += 1
                    continue
                placed += os.getxattr(pool / key, "user.hicachefs.tier") == b"memory"
            in_ram.append(placed)
            assert ask(holder, "open " + " ".join(keys)) == "ok"
            assert ask(holder, "renew") == "ok"
        sums = json.loads(ask(holder, "check"))
    finally:
        holder.kill()
        holder.wait()
    assert refused == 0
    assert in_ram == [40, 40, 40, 40]  # before: RAM was all the holder's, and new pages went to disk
    assert sums == {key: hashlib.sha256(data).hexdigest() for key, data in pages.items()}
    stats = mount.stats()
    assert stats["tiers"]["disk"]["pages"] > 0 and "ENOSPC" not in stats["errors"]


def test_a_plain_user_reading_a_small_page_in_every_slab_keeps_no_page_of_another_size_out_of_ram(
        public_mount_factory, tmp_path):
    """Each pinned slot keeps its whole slab (an eighth of RAM) from serving another size: a plain
    user reading one 64 KiB page in each slab, 512 KiB of its share, held them all, and root's
    1 MiB pages found no slot (ENOSPC with no disk tier). Its pins give way to a writer now; its
    reads find its pages again (on the disk tier)."""
    mount = public_mount_factory("--memory", "16M", "--disk", str(tmp_path / "disk"), "--disk-size", "256M")
    pool = mount.page_dir()
    small = {f"s{i}": content(f"s{i}", 64 << 10) for i in range(256)}  # 16 MiB: every slab, 32 pages each
    for key, data in small.items():
        publish(pool, key, data)
    holder = start_holder(pool)
    try:
        assert ask(holder, "open " + " ".join(f"s{i}" for i in range(0, 256, 32))) == "ok"  # one in each slab
        big = {f"b{i}": content(f"b{i}", MiB) for i in range(4)}
        tiers = []
        for key, data in big.items():
            publish(pool, key, data)
            tiers.append(os.getxattr(pool / key, "user.hicachefs.tier"))
            assert ask(holder, "renew") == "ok"  # it keeps reading
        sums = json.loads(ask(holder, "check"))
    finally:
        holder.kill()
        holder.wait()
    assert tiers == [b"memory"] * 4  # before: all four went to the disk tier (ENOSPC with none)
    assert sums == {f"s{i}": hashlib.sha256(small[f"s{i}"]).hexdigest() for i in range(0, 256, 32)}


def test_a_held_page_replaced_and_then_let_go_reads_eio_never_the_new_page(public_mount_factory):
    mount = public_mount_factory("--memory", "64M")  # the holder may pin 16 MiB
    pool = mount.page_dir()
    old = content("old", MiB)
    publish(pool, "k", old)
    others = [f"o{i}" for i in range(20)]
    for key in others:
        publish(pool, key, content(key, MiB))
    holder = start_holder(pool)
    try:
        assert ask(holder, "open k") == "ok"
        publish(pool, "k", content("new", 4096))
        assert json.loads(ask(holder, "check")) == {"k": hashlib.sha256(old).hexdigest()}  # pinned: whole, old
        assert ask(holder, "open " + " ".join(others)) == "ok"  # 20 MiB more: k, read least recently, lets go
        sums = json.loads(ask(holder, "check"))
    finally:
        holder.kill()
        holder.wait()
    assert sums.pop("k") == "EIO"  # its version is no longer stored: the contract's other answer
    assert sums == {key: hashlib.sha256(content(key, MiB)).hexdigest() for key in others}


def test_a_plain_users_fetch_handles_keep_no_new_page_out_of_ram(public_mount_factory):
    """Issue 29, item 6: a fetch handle holds the pages of its last read until its next request.
    A plain user's 64 handles, each holding one page of a 64 MiB RAM tier with no disk tier (all
    of it), hold at most a quarter of the tier between them (and only for the pin lease): root's
    40 new pages are neither refused nor evicted by one another."""
    mount = public_mount_factory("--memory", "64M")
    pool = mount.page_dir()
    held = [f"held{i}" for i in range(64)]
    for key in held:
        publish(pool, key, content(key, MiB))
    relative = pool.relative_to(mount.path)
    with attacks.start("held-fetches", mount.path, relative, MiB, ",".join(held)) as holder:
        refused = 0
        for i in range(40):
            try:
                publish(pool, f"new{i}", content(i, MiB))
            except OSError:
                refused += 1
        kept = sum((pool / f"new{i}").exists() for i in range(40))
        figures = holder.finish()
    assert figures["errors"] == {} and refused == 0 and kept == 40
