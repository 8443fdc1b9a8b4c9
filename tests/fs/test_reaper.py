"""The daemon's background task that discards abandoned temporary files survives a failing
round: it logs the error and keeps running (an exception out of it would end the daemon)."""

from __future__ import annotations

import logging

import trio
import trio.testing

from hicachefs.daemon.daemon import _reap_abandoned


class FlakyNamespace:
    """Just what the reaper uses of a Namespace; its first round fails."""

    temp_timeout_s = 60.0

    def __init__(self):
        self.rounds = 0

    def reap_abandoned(self) -> int:
        self.rounds += 1
        if self.rounds == 1:
            raise RuntimeError("a store error while discarding")
        return 0


def test_the_reaper_logs_a_failing_round_and_keeps_going(caplog):
    namespace = FlakyNamespace()

    async def main():
        with trio.move_on_after(17.5):  # three rounds, one every 5 s
            await _reap_abandoned(namespace)

    with caplog.at_level(logging.ERROR, logger="hicachefs"):
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert namespace.rounds == 3
    failures = [r for r in caplog.records if "discarding abandoned temporary files failed" in r.getMessage()]
    assert len(failures) == 1 and "a store error while discarding" in failures[0].exc_text
