#!/usr/bin/env python3
"""The README's demo: chat turns served by SGLang's own radix cache and cache controller (SGLang
0.5.23, on the CPU) over HiCacheFS on live mounts: every hit it prints is SGLang's decision.

  demo.py serve MOUNT [--show-top]   serve every turn of the workload (scripts/lib/demo_workload.py):
                                     what SGLang found where, its hit rate on hicachefs, where
                                     those hits came from, how pages moved between the tiers,
                                     GB/s, and what SGLang's storage metrics say
  demo.py two-hosts MOUNT_A MOUNT_B  two hosts' mounts on one shared tier: host A serves every
                                     turn but the last; the last turn of half the conversations
                                     goes to host B, which loads their prefixes from the shared tier

``scripts/demo.sh`` mounts, runs these, and shows the mounts with the shell tools and
``hicachefs stats``/``top``. Exit status 0 when every page SGLang handed over, read back and loaded
to its device held the right bytes and no storage call failed.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from tqdm import tqdm

from lib.demo_workload import (
    MODEL_SHAPES, Server, Tally, Workload, human, mount_stats, tier_activity, tiers_top_down)
from hicachefs_testing.sglang_workload import Conversation

#: How long host A's write-behind, then host B's view of its pages, may take before the demo goes on.
SHARED_WAIT_S = 30.0


@dataclass
class PassResult:
    """One mount's share of some turns: the client's tally, per tier the hits, demotions,
    promotions and evictions the mount counted meanwhile, and the client's errors."""

    tally: Tally
    tiers: Dict[str, Dict[str, int]]
    errors: Dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    metrics: Dict[str, float] = field(default_factory=dict)  # SGLang's storage metrics afterwards

    @property
    def ok(self) -> bool:
        return self.tally.bad == 0 and not self.errors


@dataclass
class TwoHostsResult:
    """What host A's turns gave, how its pages reached host B, and the last turn on each host."""

    earlier_turns: PassResult  # host A, every turn but the last
    written_behind: int  # pages host A copied to the shared tier
    dropped: int  # pages host A's write-behind did not take (its queue was full)
    seen_after_s: Optional[float]  # from host A's last turn until host B knew all it wrote; None: not in time
    last_turn: Dict[str, PassResult]  # "A", "B"

    @property
    def ok(self) -> bool:
        return self.earlier_turns.ok and all(r.ok for r in self.last_turn.values()) and self.shared

    @property
    def shared(self) -> bool:
        """Whether host B loaded any of the prefixes host A left on the shared tier (where host A
        loaded any of its own): the point of the shared tier, which a regression once took to 0
        of 188 while every call still succeeded."""
        a, b = (self.last_turn[h].tally for h in ("A", "B"))
        return b.loaded > 0 or b.wanted == 0 or a.loaded == 0 or self.written_behind == 0


def serve(mountpoint: str, workload: Workload, show_top: bool = False) -> PassResult:
    """Serve every turn of every conversation on one mount and print what happened. With
    ``show_top``, ``hicachefs top --count 1`` watches the mount from half-way through, and its
    view is printed at the end."""
    print(workload.describe())
    server = Server(mountpoint, workload)
    work = workload.serving_order(workload.make_conversations(), range(workload.turns))
    top: List[subprocess.Popen] = []

    def before_turn(done: int) -> None:
        if show_top and done == len(work) // 2:
            top.append(subprocess.Popen([sys.executable, "-m", "hicachefs.cli", "top", mountpoint, "--count", "1"],
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))

    try:
        result = serve_turns({mountpoint: server}, lambda conv: mountpoint, work, before_turn)[mountpoint]
        view = top[0].communicate(timeout=60)[0] if top else None
    finally:
        for process in top:
            if process.poll() is None:
                process.kill()
                process.wait()
        server.close()
    t = result.tally
    print(f"served               {t.turns} turns in {result.seconds:.1f} s by SGLang's radix cache and cache controller")
    print(f"prompt pages         {t.prompt}: {t.device} in SGLang's device pool, {t.host} in its host pool, "
          f"{t.wanted} left for hicachefs")
    print(f"hicachefs            SGLang's prefetch loaded {t.loaded} of those {t.wanted} (hit rate {t.hit_rate:.1%}), "
          f"{t.bad} with wrong bytes")
    print(f"hits by tier         {hits_by_tier(result.tiers)}")
    print(f"pages moved          {moves(result.tiers)}")
    print(f"pages stored         {t.stored} new ({human(t.written_bytes)})"
          if t.stored else "pages stored         none new: every page was there")
    print(f"read                 {human(t.read_bytes)} in {t.read_s:.2f} s = "
          f"{t.read_bytes / max(t.read_s, 1e-9) / 1e9:.2f} GB/s (batch_get_v1 into SGLang's host pool)")
    if t.stored:
        print(f"write                {human(t.written_bytes)} in {t.write_s:.2f} s = "
              f"{t.written_bytes / max(t.write_s, 1e-9) / 1e9:.2f} GB/s (batch_set_v1 from SGLang's host pool)")
    print(f"SGLang's metrics     {sglang_metrics(result.metrics)}")
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


def two_hosts(mount_a: str, mount_b: str, workload: Workload) -> TwoHostsResult:
    """Host A serves every turn but the last; then the last turn of the first half of the
    conversations goes to host A, of the second half to host B (as a load balancer that does
    not know where a conversation was served would send it). Prints what each host saw."""
    print(workload.describe())
    conversations = workload.make_conversations()
    # SGLang registers its storage metrics once per process: host B's, the interesting ones.
    hosts = {"A": Server(mount_a, workload, storage_metrics=False)}
    hosts["B"] = Server(mount_b, workload)
    try:
        # A real turn takes seconds to decode its reply, and meanwhile the write-behind copies
        # the pages its prompt added; this demo decodes nothing, so it waits for that instead.
        earlier = serve_turns({"A": hosts["A"]}, lambda conv: "A",
                              workload.serving_order(conversations, range(workload.turns - 1)),
                              lambda done: written_behind(mount_a))["A"]
        last_turn_done = time.monotonic()
        written, dropped = written_behind(mount_a)
        seen_after = None
        while time.monotonic() - last_turn_done < SHARED_WAIT_S:
            if shared_pages(mount_b) >= shared_pages(mount_a):
                seen_after = time.monotonic() - last_turn_done
                break
            time.sleep(0.05)
        half = {id(conv): "A" if i < len(conversations) // 2 else "B" for i, conv in enumerate(conversations)}
        last = serve_turns(hosts, lambda conv: half[id(conv)],
                           workload.serving_order(conversations, range(workload.turns - 1, workload.turns)))
    finally:
        for host in hosts.values():
            host.close()

    t, n = earlier.tally, len(conversations)
    print(f"host A               turns 1-{workload.turns - 1} of the {n} conversations ({t.turns} turns): "
          f"{t.wanted} pages left for hicachefs, {t.loaded} loaded (hit rate {t.hit_rate:.1%}), {t.stored} stored")
    seen = (f"host B knows them all {seen_after:.1f} s after host A's last turn" if seen_after is not None
            else f"host B does not know them all within {SHARED_WAIT_S:.0f} s")
    print(f"shared tier          host A wrote {written} pages behind ({dropped} dropped); {seen}")
    print(f"turn {workload.turns:<15} conversations 1-{n // 2} on host A, {n // 2 + 1}-{n} on host B:")
    print("          turns  wanted  loaded  hit rate  wrong bytes  hits by tier")
    for name, host in last.items():
        t = host.tally
        print(f"  host {name}  {t.turns:5d}  {t.wanted:6d}  {t.loaded:6d}  {t.hit_rate:8.1%}  {t.bad:11d}  "
              f"{hits_by_tier(host.tiers)}")
    a, b = (last[h].tally.wanted - last[h].tally.loaded for h in ("A", "B"))
    if a == b:
        print(f"host B missed {b} pages, as host A did: only the new user tokens, which no host had stored; "
              "it loaded the prefixes host A computed from the shared tier")
    else:
        print(f"host B missed {b} pages, host A {a}"
              + (f": host A's write-behind dropped {dropped} pages (its queue was full), and a prefix "
                 "stops at its first missing page" if dropped else ""))
    print(f"SGLang's metrics, B  {sglang_metrics(last['B'].metrics)}")
    errors = {name: host.errors for name, host in [("A", earlier), *last.items()] if host.errors}
    print(f"client errors        {errors or 'none'}")
    return TwoHostsResult(earlier, written, dropped, seen_after, last)


def written_behind(mountpoint: str) -> Tuple[int, int]:
    """Once the mount's write-behind has nothing queued or in flight (or after SHARED_WAIT_S):
    (pages written behind, pages dropped)."""
    deadline = time.monotonic() + SHARED_WAIT_S
    while True:
        shared = mount_stats(mountpoint)["tiers"]["shared"]
        idle = shared["queue_pages"] == 0 and shared["writing"] == 0
        if idle or time.monotonic() > deadline:
            return shared["written_behind"], shared["dropped"]
        time.sleep(0.01)


def shared_pages(mountpoint: str) -> int:
    """The pages the mount's daemon knows on the shared tier (its own and other hosts')."""
    return mount_stats(mountpoint)["tiers"]["shared"]["pages"]


def serve_turns(hosts: Dict[str, Server], host_of: Callable[[Conversation], str], work: List[Conversation],
                before_turn: Optional[Callable[[int], object]] = None) -> Dict[str, PassResult]:
    """Serve ``work`` (conversations in turn order), each turn on ``hosts[host_of(conv)]``,
    calling ``before_turn(turns done so far)`` first. Per host: what its turns took and gave."""
    before = {name: mount_stats(s.mountpoint) for name, s in hosts.items()}
    errors_before = {name: s.client_errors() for name, s in hosts.items()}
    tallies = {name: Tally() for name in hosts}
    everything = Tally()
    started = time.perf_counter()
    with tqdm(work, unit="turn", dynamic_ncols=True, disable=None, leave=False) as bar:
        for done, conv in enumerate(bar):
            if before_turn is not None:
                before_turn(done)
            turn = hosts[host_of(conv)].serve(conv)
            tallies[host_of(conv)].add(turn)
            everything.add(turn)
            bar.set_postfix(hit=f"{everything.hit_rate:.0%}", stored=everything.stored, bad=everything.bad,
                            refresh=False)
    seconds = time.perf_counter() - started
    for s in hosts.values():
        s.report_reads()  # so that the daemons' hits below count every read
    results = {}
    for name, s in hosts.items():
        grown = {k: v - errors_before[name].get(k, 0) for k, v in s.client_errors().items()}
        results[name] = PassResult(tallies[name], tier_activity(before[name], mount_stats(s.mountpoint)),
                                   {k: v for k, v in grown.items() if v}, seconds, s.storage_metrics())
    return results


def sglang_metrics(metrics: Dict[str, float]) -> str:
    """SGLang's storage metrics in one line: tokens prefetched and backed up, calls and pages."""
    if not metrics:
        return "none (--enable-metrics is off)"

    def calls(kind: str) -> str:
        n, pages = metrics.get(f"sglang:{kind}_pgs:count", 0), metrics.get(f"sglang:{kind}_pgs:sum", 0)
        bandwidth = metrics.get(f"sglang:{kind}_bandwidth:sum", 0) / n if n else 0
        return f"{int(n)} {kind} calls ({pages / n if n else 0:.1f} pages, {bandwidth:.2f} GB/s each)"

    return (f"{int(metrics.get('sglang:prefetched_tokens_total', 0))} tokens prefetched, "
            f"{int(metrics.get('sglang:backuped_tokens_total', 0))} backed up; {calls('prefetch')}, {calls('backup')}")


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
                    page_size=args.page_size, seed=args.seed)


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
    shape.add_argument("--seed", type=int, default=defaults.seed)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("serve", parents=[shape], help="serve the workload on one mount")
    one.add_argument("mountpoint", help="a live hicachefs mount")
    one.add_argument("--show-top", action="store_true", help="show a `hicachefs top --count 1` view taken meanwhile")
    two = commands.add_parser("two-hosts", parents=[shape],
                              help="host B serves the last turn of half the conversations host A served")
    two.add_argument("mount_a", help="host A's hicachefs mount, with --shared")
    two.add_argument("mount_b", help="host B's hicachefs mount, with --shared on the same directory")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    # On the CPU, torch.cpu.Event cannot time, and SGLang says so once (hicachefs_testing.sglang_cpu).
    logging.getLogger("sglang.srt.mem_cache.l2_transfer").setLevel(logging.ERROR)
    parser = build_parser()
    args = parser.parse_args(argv)
    mounts = [args.mountpoint] if args.command == "serve" else [args.mount_a, args.mount_b]
    for mount in mounts:
        if not os.path.isdir(os.path.join(mount, ".hicachefs")):
            parser.error(f"{mount} is not a live hicachefs mount (no .hicachefs/)")
    if args.command == "serve":
        result = serve(args.mountpoint, workload_from(args), args.show_top)
    else:
        if args.turns < 2:
            parser.error("two-hosts needs --turns of at least 2: host B serves the last one")
        for mount in mounts:
            if "shared" not in mount_stats(mount).get("tiers", {}):
                parser.error(f"{mount} has no shared tier: mount it with --shared")
        result = two_hosts(args.mount_a, args.mount_b, workload_from(args))
    if not result.ok:
        why = ("host B loaded none of the pages host A shared" if isinstance(result, TwoHostsResult) and not result.shared
               else "wrong bytes, failed storage calls or client errors")
        print(f"FAILED: {why}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
