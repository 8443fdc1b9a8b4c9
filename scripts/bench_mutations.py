#!/usr/bin/env python3
"""With ``--workers``, how should the store's mutations be serialised: by one owner the workers
forward to (what the daemon does), or by a lock every worker takes over state in shared memory?

Each of P client processes makes mutations as fast as it can, each ``--work-us`` of work (the
owner's Python for one page's plan and publish is some 40 us), three ways:
  - forwarded: over hicachefs's own worker channel (``fs/channel.py``: the worker's ``Channel``,
    the owner's ``AsyncChannel``, each on a trio loop, one owner task per client), the owner
    doing the work;
  - locked: each client takes one cross-process lock (``multiprocessing.Lock``, a futex-backed
    semaphore in shared memory) and does the work itself;
  - alone: no shared state at all, the ceiling neither design reaches.
Prints mutations a second, the wait a client sees per mutation and the CPU time all processes
spent per mutation, and the ratio locked/forwarded. About 10 s. It measures the serialisation
only: the state itself (the index, the names, the handles) is Python objects in the owner, and a
lock would first need all of it in shared memory.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import socket
import time

import trio

from hicachefs.fs.channel import AsyncChannel, Channel


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def forwarding_client(sock: socket.socket, seconds: float, counts, index: int) -> None:
    async def mutations() -> int:
        channel, made, end = Channel(sock), 0, time.monotonic() + seconds
        while time.monotonic() < end:
            await channel.call(("mutate", made))
            made += 1
        return made

    counts[index] = trio.run(mutations)


def locking_client(lock, work: float, seconds: float, counts, index: int) -> None:
    made, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        with lock:
            spin(work)
        made += 1
    counts[index] = made


def alone_client(work: float, seconds: float, counts, index: int) -> None:
    made, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        spin(work)
        made += 1
    counts[index] = made


async def owner(channels: list[AsyncChannel], work: float) -> None:
    async def serve(channel: AsyncChannel) -> None:
        while (call := await channel.next_call()) is not None:
            spin(work)
            await channel.answer(call[0], call[1][1])

    async with trio.open_nursery() as nursery:
        for channel in channels:
            nursery.start_soon(serve, channel)


def run(mode: str, processes: int, work: float, seconds: float) -> tuple[float, float, float]:
    """(mutations a second, seconds a client waits per mutation, CPU seconds per mutation)."""
    context = multiprocessing.get_context("fork")
    counts = context.Array("q", processes)
    lock = context.Lock()
    pairs = [socket.socketpair() for _ in range(processes)] if mode == "forwarded" else []
    clients = []
    for index in range(processes):
        if mode == "forwarded":
            target, args = forwarding_client, (pairs[index][1], seconds, counts, index)
        elif mode == "locked":
            target, args = locking_client, (lock, work, seconds, counts, index)
        else:
            target, args = alone_client, (work, seconds, counts, index)
        clients.append(context.Process(target=target, args=args))
    cpu, started = cpu_seconds(), time.monotonic()
    for client in clients:
        client.start()
    if mode == "forwarded":
        for _, theirs in pairs:
            theirs.close()
        trio.run(owner, [AsyncChannel(ours) for ours, _ in pairs], work)
    for client in clients:
        client.join()
        if client.exitcode != 0:
            raise RuntimeError(f"a {mode} client failed with exit status {client.exitcode}")
    elapsed, spent, made = time.monotonic() - started, cpu_seconds() - cpu, sum(counts)
    return made / elapsed, processes * elapsed / made, spent / made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", default="1,2,4", help="client process counts (default 1,2,4)")
    parser.add_argument("--work-us", type=float, default=40.0, help="work per mutation, us (default 40)")
    parser.add_argument("--seconds", type=float, default=1.0, help="per run (default 1)")
    args = parser.parse_args()
    work = args.work_us / 1e6
    print(f"mutations of {args.work_us:g} us of work each, {args.seconds:g} s a run, {os.cpu_count()} CPUs")
    print(f"{'clients':>7}  {'mode':<9}  {'mutations/s':>11}  {'wait us':>8}  {'CPU us':>7}  locked vs forwarded")
    for processes in (int(p) for p in args.processes.split(",")):
        rates = {}
        for mode in ("forwarded", "locked", "alone"):
            rate, wait, cpu = run(mode, processes, work, args.seconds)
            rates[mode] = rate
            ratio = f"{rates['locked'] / rates['forwarded']:.2f}x" if mode == "locked" else ""
            print(f"{processes:>7}  {mode:<9}  {rate:>11,.0f}  {wait * 1e6:>8.1f}  {cpu * 1e6:>7.1f}  {ratio}")


if __name__ == "__main__":
    main()
