"""The wire between a worker and the owner (``fs/channel.py``): calls of several tasks at once,
each answered in its own time, every byte intact."""

from __future__ import annotations

import socket

import trio

from hicachefs.fs.channel import AsyncChannel, Channel


def test_calls_in_flight_at_once_each_get_their_own_answer_in_any_order():
    worker_end, owner_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    worker, owner = Channel(worker_end), AsyncChannel(owner_end)
    big = bytes(range(256)) * 16384  # 4 MiB: more than a socket buffer, both ways
    answers = {}

    async def owner_side() -> None:
        calls = [await owner.next_call() for _ in range(3)]
        assert [value for _, value in calls] == ["slow", "fast", big]
        fast, slow, large = calls[1][0], calls[0][0], calls[2][0]
        await owner.answer(fast, "fast answer")
        await owner.answer(large, bytes(reversed(big)))
        await owner.answer(slow, "slow answer")
        assert await owner.next_call() is None  # the worker closed its end

    async def call(name: str, value) -> None:
        answers[name] = await worker.call(value)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(owner_side)
            async with trio.open_nursery() as calls:
                calls.start_soon(call, "slow", "slow")
                await trio.sleep(0.01)
                calls.start_soon(call, "fast", "fast")
                await trio.sleep(0.01)
                calls.start_soon(call, "large", big)
            assert worker.in_flight == 0
            worker.close()

    trio.run(main)
    assert answers == {"slow": "slow answer", "fast": "fast answer", "large": bytes(reversed(big))}
    owner.close()
