#!/usr/bin/env python3
"""The README's demo: a chat serving workload through SGLang's client HiCacheFS on a live mount.

  demo.py serve MOUNT [--show-top]   serve every turn of the workload (scripts/demo_workload.py):
                                     the hit rate, where the hits came from, how pages moved
                                     between the tiers, GB/s

``scripts/demo.sh`` mounts, runs this, and shows the mount with the shell tools and
``hicachefs stats``/``top``. Exit status 0 when every loaded page held the right bytes and the
client saw no errors.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

from tqdm import tqdm

from demo_workload import (
    MODEL_SHAPES, Conversation, Server, Tally, Workload, human, mount_stats, tier_activity, tiers_top_down)


@dataclass
class PassResult:
    """One mount's share of some turns: the client's tally, per tier the hits, demotions,
    promotions and evictions the mount counted meanwhile, and the client's errors."""

    tally: Tally
    tiers: Dict[str, Dict[str, int]]
    errors: Dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.tally.bad == 0 and not self.errors


def serve(mountpoint: str, workload: Workload, show_top: bool = False) -> PassResult:
    """Serve every turn of every conversation on one mount and print what happened. With
    ``show_top``, ``hicachefs top --count 1`` watches the mount from half-way through, and its
    view is printed at the end."""
    print(workload.describe())
    server = Server(mountpoint, workload)
    work = workload.serving_order(workload.make_conversations(), range(workload.turns))
    top: List[subprocess.Popen] = []

    def start_top() -> None:
        top.append(subprocess.Popen([sys.executable, "-m", "hicachefs.cli", "top", mountpoint, "--count", "1"],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))

    try:
        result = serve_turns({mountpoint: server}, lambda conv: mountpoint, work,
                             halfway=start_top if show_top else None)[mountpoint]
        view = top[0].communicate(timeout=60)[0] if top else None
    finally:
        for process in top:
            if process.poll() is None:
                process.kill()
                process.wait()
        server.close()
    t = result.tally
    print(f"served               {t.turns} turns in {result.seconds:.1f} s")
    print(f"prefix pages         {t.wanted} wanted, {t.loaded} loaded from hicachefs "
          f"(hit rate {t.hit_rate:.1%}), {t.bad} with wrong bytes")
    print(f"hits by tier         {hits_by_tier(result.tiers)}")
    print(f"pages moved          {moves(result.tiers)}")
    print(f"pages stored         {t.stored} new ({human(t.written_bytes)})"
          if t.stored else "pages stored         none new: every page was there")
    print(f"read                 {human(t.read_bytes)} in {t.read_s:.2f} s = "
          f"{t.read_bytes / max(t.read_s, 1e-9) / 1e9:.2f} GB/s (preadv into the host pool)")
    if t.stored:
        print(f"write                {human(t.written_bytes)} in {t.write_s:.2f} s = "
              f"{t.written_bytes / max(t.write_s, 1e-9) / 1e9:.2f} GB/s (exists check + pwritev + rename)")
    print(f"client errors        {result.errors or 'none'}")
    stats = mount_stats(mountpoint)
    for tier in tiers_top_down(stats):
        facts = stats["tiers"][tier]
        print(f"tier {tier:<15} {facts['pages']} pages, "
              f"{human(facts['used_bytes'])} of {human(facts['capacity_bytes'])} used")
    if view is not None:
        print(f"\n$ hicachefs top {mountpoint} --count 1      (taken half-way through the turns)")
        print(view.rstrip())
    return result


def serve_turns(hosts: Dict[str, Server], host_of: Callable[[Conversation], str], work: List[Conversation],
                halfway: Optional[Callable[[], None]] = None) -> Dict[str, PassResult]:
    """Serve ``work`` (conversations in turn order), each turn on ``hosts[host_of(conv)]``;
    call ``halfway`` half-way through. Per host: what its turns took and gave."""
    before = {name: mount_stats(s.mountpoint) for name, s in hosts.items()}
    errors_before = {name: s.client_errors() for name, s in hosts.items()}
    tallies = {name: Tally() for name in hosts}
    everything = Tally()
    started = time.perf_counter()
    with tqdm(work, unit="turn", dynamic_ncols=True, disable=None, leave=False) as bar:
        for done, conv in enumerate(bar):
            if halfway is not None and done == len(work) // 2:
                halfway()
            turn = hosts[host_of(conv)].serve(conv)
            tallies[host_of(conv)].add(turn)
            everything.add(turn)
            bar.set_postfix(hit=f"{everything.hit_rate:.0%}", stored=everything.stored, bad=everything.bad,
                            refresh=False)
    seconds = time.perf_counter() - started
    results = {}
    for name, s in hosts.items():
        grown = {k: v - errors_before[name].get(k, 0) for k, v in s.client_errors().items()}
        results[name] = PassResult(tallies[name], tier_activity(before[name], mount_stats(s.mountpoint)),
                                   {k: v for k, v in grown.items() if v}, seconds)
    return results


def hits_by_tier(tiers: Dict[str, Dict[str, int]]) -> str:
    return ", ".join(f"{name} {facts['hits']}" for name, facts in tiers.items() if facts["hits"]) or "none"


def moves(tiers: Dict[str, Dict[str, int]]) -> str:
    parts = []
    for name, facts in tiers.items():
        if facts["demotions"]:
            parts.append(f"{facts['demotions']} demoted from {name}")
        if facts["promotions"]:
            parts.append(f"{facts['promotions']} promoted into {name}")
    parts.append(f"{sum(facts['evictions'] for facts in tiers.values())} evicted")
    return ", ".join(parts)


def workload_from(args: argparse.Namespace) -> Workload:
    return Workload(model=args.model, conversations=args.conversations, turns=args.turns,
                    system_prompts=args.system_prompts, system_tokens=args.system_tokens,
                    user_tokens=args.user_tokens, reply_tokens=args.reply_tokens,
                    page_size=args.page_size, tp_size=args.tp_size, seed=args.seed)


def build_parser() -> argparse.ArgumentParser:
    defaults = Workload()
    shape = argparse.ArgumentParser(add_help=False)
    shape.add_argument("--model", default=defaults.model, choices=sorted(MODEL_SHAPES))
    shape.add_argument("--conversations", type=int, default=defaults.conversations)
    shape.add_argument("--turns", type=int, default=defaults.turns)
    shape.add_argument("--system-prompts", type=int, default=defaults.system_prompts,
                       help="distinct shared system prompts")
    shape.add_argument("--system-tokens", type=int, default=defaults.system_tokens)
    shape.add_argument("--user-tokens", type=int, default=defaults.user_tokens, help="tokens a user adds per turn")
    shape.add_argument("--reply-tokens", type=int, default=defaults.reply_tokens,
                       help="tokens the model replies per turn")
    shape.add_argument("--page-size", type=int, default=defaults.page_size, help="tokens per page")
    shape.add_argument("--tp-size", type=int, default=defaults.tp_size, help="shard as rank 0 of this many")
    shape.add_argument("--seed", type=int, default=defaults.seed)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("serve", parents=[shape], help="serve the workload on one mount")
    one.add_argument("mountpoint", help="a live hicachefs mount")
    one.add_argument("--show-top", action="store_true", help="show a `hicachefs top --count 1` view taken meanwhile")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not os.path.isdir(os.path.join(args.mountpoint, ".hicachefs")):
        parser.error(f"{args.mountpoint} is not a live hicachefs mount (no .hicachefs/)")
    result = serve(args.mountpoint, workload_from(args), args.show_top)
    if not result.ok:
        print("FAILED: wrong bytes or client errors", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
