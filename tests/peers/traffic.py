"""Agentic traffic for the differential tests: engines with a GPU pool that offloads what it
evicts to a CPU pool, publishing vLLM 0.33's events, and prompts with shared prefixes.

Pure state, no sockets: `OffloadingEngine.run` returns the events one request causes. GPU
eviction is LRU with a request's tail blocks first (vLLM frees a request's blocks in reverse
order); an evicted block is stored on the CPU under its parent (vLLM's CPU offloading
connector publishes such stores), and the CPU pool evicts LRU too.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Sequence

from kvsi.hashing import block_hashes
from kvsi.subscriber.wire import BlockRemoved, BlockStored, KVCacheEvent

BLOCK_SIZE = 4


class OffloadingEngine:
    """One DP rank's block pools: `gpu_blocks` on the GPU, `cpu_blocks` on the CPU."""

    def __init__(self, gpu_blocks: int, cpu_blocks: int) -> None:
        self.gpu: OrderedDict[int, None] = OrderedDict()
        self.cpu: OrderedDict[int, None] = OrderedDict()
        self.gpu_blocks = gpu_blocks
        self.cpu_blocks = cpu_blocks
        self.parent: dict[int, int | None] = {}
        self.tokens: dict[int, list[int]] = {}

    def run(self, token_ids: Sequence[int], session_id: str | None = None) -> list[KVCacheEvent]:
        """Prefill `token_ids`: the leading blocks on the GPU are hits, the rest are stored
        (evicting, offloading to the CPU) after the last hit."""
        hashes = block_hashes(list(token_ids), block_size=BLOCK_SIZE)
        hit = 0
        while hit < len(hashes) and hashes[hit] in self.gpu:
            hit += 1
        events: list[KVCacheEvent] = []
        new = hashes[hit:]
        for i, h in enumerate(hashes):
            self.parent.setdefault(h, hashes[i - 1] if i else None)
            self.tokens.setdefault(h, list(token_ids[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE]))
        events += self._evict_gpu(len(self.gpu) + len(new) - self.gpu_blocks, set(hashes))
        if new:
            events.append(
                _stored(
                    new,
                    hashes[hit - 1] if hit else None,
                    list(token_ids[hit * BLOCK_SIZE : len(hashes) * BLOCK_SIZE]),
                    "GPU",
                    session_id,
                )
            )
        for h in reversed(hashes):  # the tail is freed first: evicted first
            self.gpu[h] = None
            self.gpu.move_to_end(h)
        return events

    def _evict_gpu(self, count: int, pinned: set[int]) -> list[KVCacheEvent]:
        victims = [h for h in self.gpu if h not in pinned][: max(count, 0)]
        events: list[KVCacheEvent] = []
        for h in victims:
            del self.gpu[h]
            events.append(BlockRemoved(block_hashes=[h], medium="GPU"))
            if h not in self.cpu:
                events += self._evict_cpu(len(self.cpu) + 1 - self.cpu_blocks)
                self.cpu[h] = None
                events.append(_stored([h], self.parent[h], self.tokens[h], "CPU", None))
            self.cpu.move_to_end(h)
        return events

    def _evict_cpu(self, count: int) -> list[KVCacheEvent]:
        victims = list(self.cpu)[: max(count, 0)]
        for h in victims:
            del self.cpu[h]
        return [BlockRemoved(block_hashes=victims, medium="CPU")] if victims else []


def _stored(
    hashes: list[int], parent: int | None, tokens: list[int], medium: str, session: str | None
) -> BlockStored:
    return BlockStored(
        block_hashes=hashes,
        parent_block_hash=parent,
        token_ids=tokens,
        block_size=BLOCK_SIZE,
        lora_id=None,
        medium=medium,
        lora_name=None,
        session_id=session,
    )


class Prompts:
    """Agent sessions over a few shared system prompts: each turn extends its session's
    prompt; `query` draws a prompt a router could ask about (a session's prefix with a new
    tail, a shared prompt alone, or noise), often with a partial last block."""

    def __init__(self, rng: random.Random, systems: int = 4, system_blocks: int = 3) -> None:
        self.rng = rng
        self.systems = [self._tokens(system_blocks * BLOCK_SIZE) for _ in range(systems)]
        self.sessions: list[list[int]] = []

    def _tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(1, 50_000) for _ in range(n)]

    def turn(self) -> tuple[str, list[int]]:
        """A session's next prompt (a new session one time in four)."""
        rng = self.rng
        if not self.sessions or rng.random() < 0.25:
            self.sessions.append(list(rng.choice(self.systems)))
        index = rng.randrange(len(self.sessions))
        self.sessions[index] += self._tokens(rng.randrange(2, 4 * BLOCK_SIZE))
        return f"s{index}", self.sessions[index]

    def query(self) -> list[int]:
        rng = self.rng
        pick = rng.random()
        if pick < 0.1:
            return self._tokens(rng.randrange(0, 6 * BLOCK_SIZE))
        base = (
            rng.choice(self.systems)
            if pick < 0.25 or not self.sessions
            else rng.choice(self.sessions)
        )
        keep = rng.randrange(0, len(base) + 1)
        return base[:keep] + self._tokens(rng.randrange(0, 2 * BLOCK_SIZE))
