"""Chat traffic for SGLang's cache, and the phases the tests and the demo (and its table) run.

Conversations share a few system prompts and grow turn by turn. A conversation's tokens come
from its own generator, so any server (any backend, any host) serving its next turn builds
the same prompt, and SGLang computes the same page keys.

``run_phases`` serves one workload on one ``SGLangCache`` in three phases:
  - cold: the first turns, one request at a time, as SGLang writes through and evicts;
  - warm: after evicting the device and host pools, the next turn of every conversation, one at
    a time, so their prefixes come back from storage;
  - burst: the next turn of every conversation at once: their prefetches overlap, and those
    past the controller's prefetch capacity are declined by SGLang's rate limit.
Not thread-safe.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

from .sglang_cache import RequestResult, SGLangCache, Turn

VOCAB = 151_643


@dataclass(frozen=True)
class ChatWorkload:
    """The shape of the traffic."""

    conversations: int = 4
    system_prompts: int = 2
    system_tokens: int = 96
    user_tokens: int = 24
    reply_tokens: int = 24
    seed: int = 0

    def make_conversations(self) -> List["Conversation"]:
        """The conversations, each with its own generator: the same for every server."""
        rng = random.Random(self.seed)
        prompts = [[rng.randrange(VOCAB) for _ in range(self.system_tokens)] for _ in range(self.system_prompts)]
        return [Conversation(random.Random(rng.random()), prompts[i % len(prompts)], self)
                for i in range(self.conversations)]

    def tokens_after(self, turns: int) -> List[List[int]]:
        """Per conversation, every token of its first ``turns`` turns (prompts and replies)."""
        conversations = self.make_conversations()
        for _ in range(turns):
            for conv in conversations:
                conv.next_turn()
        return [conv.system_prompt + conv.history for conv in conversations]

    def order(self, conversations: List["Conversation"], turn: int) -> List["Conversation"]:
        """The conversations in the order their ``turn``-th turns arrive (traffic interleaves)."""
        return random.Random(self.seed * 1000 + turn).sample(conversations, len(conversations))


class Conversation:
    """A chat: a shared system prompt, then the user's and the model's tokens, turn by turn."""

    def __init__(self, rng: random.Random, system_prompt: List[int], workload: ChatWorkload) -> None:
        self.rng = rng
        self.workload = workload
        self.system_prompt = system_prompt
        self.history: List[int] = []
        self.turns_served = 0

    def next_turn(self) -> Turn:
        """The next request (everything so far and the user's new tokens) and its reply; the
        reply joins the history."""
        prompt = self.system_prompt + self.history + self._tokens(self.workload.user_tokens)
        reply = self._tokens(self.workload.reply_tokens)
        self.history = prompt[len(self.system_prompt):] + reply
        self.turns_served += 1
        return Turn(prompt, reply)

    def _tokens(self, n: int) -> List[int]:
        return [self.rng.randrange(VOCAB) for _ in range(n)]


@dataclass
class PhaseResults:
    """Per phase, what each request got, and SGLang's prefetch decisions meanwhile."""

    requests: Dict[str, List[RequestResult]] = field(default_factory=dict)
    prefetch_outcomes: Dict[str, Dict[str, int]] = field(default_factory=dict)

    def hits(self, phase: str) -> List[tuple]:
        """Per request, in order: (device, host, storage) hit pages and the prompt's pages."""
        return [(r.device_hit, r.host_hit, r.storage_hit, r.prompt_pages) for r in self.requests[phase]]


def run_phases(server: SGLangCache, workload: ChatWorkload, cold_turns: int = 2,
               before_phase: Optional[Callable[[str], None]] = None) -> PhaseResults:
    """Serve the three phases (module docstring) on ``server``; backups settle after each.
    ``before_phase(name)`` runs as each phase starts (after the evictions before it)."""
    conversations = workload.make_conversations()
    results = PhaseResults()

    def phase(name: str, serve) -> None:
        if before_phase is not None:
            before_phase(name)
        before = server.cache.prefetch_outcome_stats_snapshot()
        results.requests[name] = serve()
        server.settle()
        after = server.cache.prefetch_outcome_stats_snapshot()
        results.prefetch_outcomes[name] = {k: after[k] - before.get(k, 0) for k in after}

    def one_at_a_time(turns: range):
        served = []
        for turn in turns:
            for conv in workload.order(conversations, turn):
                served += server.serve([conv.next_turn()])
        return served

    phase("cold", lambda: one_at_a_time(range(cold_turns)))
    server.evict_device_and_host()
    phase("warm", lambda: one_at_a_time(range(cold_turns, cold_turns + 1)))
    server.evict_device_and_host()
    phase("burst", lambda: server.serve([conv.next_turn()
                                         for conv in workload.order(conversations, cold_turns + 1)]))
    return results
