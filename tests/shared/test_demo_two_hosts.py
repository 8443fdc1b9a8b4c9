"""scripts/demo.py two-hosts on a real GlusterFS volume: host B serves the next turn of
conversations host A served, loads their prefixes from the shared tier, and misses only what
host A misses on the same turn: the new user tokens no host had stored."""

from __future__ import annotations

#: Four conversations: the last turn of two goes to host A, of the other two to host B.
SMALL = dict(conversations=4, turns=3, system_prompts=2, system_tokens=1536, user_tokens=64, reply_tokens=64)


def test_host_b_loads_host_as_prefixes_from_the_shared_tier_and_hits_as_often(demo, mount_factory, engine_root,
                                                                                capsys):
    from lib.demo_workload import Workload

    root_a, root_b = engine_root
    a = mount_factory("--memory", "256M", "--shared", str(root_a / "hc"))
    b = mount_factory("--memory", "256M", "--shared", str(root_b / "hc"))
    result = demo.two_hosts(str(a.path), str(b.path), Workload(**SMALL))
    out = capsys.readouterr().out
    assert result.ok, out
    assert result.dropped == 0 and result.written_behind == result.earlier_turns.tally.stored
    assert result.seen_after_s is not None  # host B learnt of every page host A wrote
    on_a, on_b = result.last_turn["A"], result.last_turn["B"]
    assert on_a.tally.turns == on_b.tally.turns == 2
    assert on_b.tally.loaded > 0
    assert on_b.tally.wanted - on_b.tally.loaded == on_a.tally.wanted - on_a.tally.loaded
    assert on_b.tiers["shared"]["hits"] > 0 and on_a.tiers["shared"]["hits"] == 0
    assert b.stats()["tiers"]["shared"]["hits"] == on_b.tiers["shared"]["hits"]
    assert "as host A did: only the new user tokens" in out
