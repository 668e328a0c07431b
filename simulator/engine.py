"""One simulated vLLM worker's prefix-cached block pool, emitting 0.33's KV events.

Imports no zmq, no asyncio, nothing from store/ or api/: pure state, so tests and benchmarks
drive it synchronously and compare the index against its truth.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

from kvsi.hashing import BlockHasher, event_hash_int
from kvsi.subscriber.wire import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent

GROUP_IDX = 0
"""The one KV cache group of a model with a single kind of attention."""

SPEC_KIND = "full_attention"
"""The kind vLLM's KVCacheManager stamps on that group's stores (kv_cache_spec_kind)."""


class SimulatedEngine:
    """A worker's KV cache manager: a block pool with prefix hits and LRU eviction.

    Requests are instantaneous (prefill, generate, finish in one call), so between calls no
    block is referenced and every block is evictable; during a call the request's own blocks
    are pinned. Truth is derived from the emitted events by DESIGN.md's rules, so a correct
    index fed the same events must agree with `resident()`, `session_residency()` and
    `session_losses()`; `session_frontiers()` is what the engine knows of its prompts.
    """

    def __init__(
        self,
        *,
        num_blocks: int,
        block_size: int = 16,
        seed: int | str | None = None,
        report_mode_full: bool = True,
        medium: str = "GPU",
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`seed` is the PYTHONHASHSEED analogue (None: vLLM's default NONE_HASH).
        `clock` stamps each session's last store, for `forget_idle`.

        `report_mode_full` mirrors kv_cache_report_mode="full": prefix hits are re-announced
        with the requesting session, which is what gives a session its share of a system prompt.
        """
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.report_mode_full = report_mode_full
        self.medium = medium
        self._hasher = BlockHasher(
            block_size=block_size, hash_seed=None if seed is None else str(seed)
        )
        # Oldest first: eviction takes from the front, like vLLM's free block queue.
        self._pool: OrderedDict[int, None] = OrderedDict()
        self._sessions: dict[str, set[int]] = {}
        # Reverse map (block -> sessions) so a removal reaches every holder in O(holders).
        self._holders: dict[int, set[str]] = {}
        self._lost: dict[str, int] = {}
        self._frontiers: dict[str, tuple[int, int]] = {}
        # Each session's last store here, oldest first: forget_idle takes from the front.
        self._stored_at: OrderedDict[str, float] = OrderedDict()
        self._clock = clock

    def block_hashes(self, token_ids: Sequence[int]) -> list[int]:
        """The event hashes this engine gives the full blocks of `token_ids` (vLLM's sha256)."""
        return [event_hash_int(digest) for digest in self._hasher.digests(token_ids)]

    def run_request(self, session_id: str | None, token_ids: Sequence[int]) -> list[KVCacheEvent]:
        """Serve one request and return the events vLLM would publish for it, in order.

        Order: the reuse report of the prefix hit (report mode "full"), one BlockRemoved per
        evicted block (vLLM evicts block by block while allocating), then one BlockStored for
        the newly cached blocks. A block found resident after the first miss (same prefix,
        cached by another path) is stored again: set semantics, no second copy is modelled.
        Raises ValueError if the request has more full blocks than the pool holds.
        """
        hashes = self.block_hashes(token_ids)
        if len(hashes) > self.num_blocks:
            raise ValueError(
                f"request needs {len(hashes)} blocks, the pool holds {self.num_blocks}"
            )
        size = self.block_size
        hit = 0
        while hit < len(hashes) and hashes[hit] in self._pool:
            hit += 1
        events: list[KVCacheEvent] = []
        if hit and self.report_mode_full:
            events.append(self._stored(session_id, hashes[:hit], None, token_ids[: hit * size]))
            self._at_frontier(session_id, hashes, hit - 1)
        new = hashes[hit:]
        pinned = set(hashes)
        missing = sum(1 for h in new if h not in self._pool)
        events.extend(self._evict(len(self._pool) + missing - self.num_blocks, pinned))
        if new:
            parent = hashes[hit - 1] if hit else None
            tokens = token_ids[hit * size : len(hashes) * size]
            events.append(self._stored(session_id, new, parent, tokens))
            self._at_frontier(session_id, hashes, len(hashes) - 1)
        # vLLM frees a finished request's blocks tail first, so its prefix is evicted last.
        for h in reversed(hashes):
            self._pool[h] = None
            self._pool.move_to_end(h)
        self._apply_truth(events)
        return events

    def reset(self) -> list[KVCacheEvent]:
        """Drop every block (vLLM's reset_prefix_cache); one AllBlocksCleared."""
        self._pool.clear()
        events: list[KVCacheEvent] = [AllBlocksCleared()]
        self._apply_truth(events)
        return events

    def resident(self) -> set[int]:
        """Hashes in the pool now: what a correct index holds for this worker."""
        return set(self._pool)

    def session_residency(self) -> dict[str, set[int]]:
        """Per session, its blocks on this worker as DESIGN.md defines session residency.

        Listed by a BlockStored with that session (store or reuse report), minus those removed
        since; a reset empties all. Sessions left with no block are omitted.
        """
        return {sid: set(blocks) for sid, blocks in self._sessions.items() if blocks}

    def session_losses(self) -> dict[str, int]:
        """Per session, the blocks eviction took from it here since it last stored here (a
        reset takes all it held), from the events alone; sessions that lost none omitted."""
        return {sid: n for sid, n in self._lost.items() if n}

    def forget_idle(self, before: float) -> int:
        """The index's idle rule, applied to the truth: each session whose last store here
        was before `before` loses its residency here (its blocks stay in the pool), its loss
        count and its frontier. Returns how many; the work is what it forgets."""
        forgotten = 0
        while self._stored_at:
            session_id, stored_at = next(iter(self._stored_at.items()))
            if stored_at >= before:
                break
            del self._stored_at[session_id]
            for block in self._sessions.pop(session_id, ()):
                holders = self._holders[block]
                holders.discard(session_id)
                if not holders:
                    del self._holders[block]
            self._lost.pop(session_id, None)
            self._frontiers.pop(session_id, None)
            forgotten += 1
        return forgotten

    def session_frontiers(self) -> dict[str, tuple[int, int]]:
        """Per session, the block it stored here last and that block's index in its prompt:
        what the engine knows, not what the events say."""
        return dict(self._frontiers)

    @property
    def usage(self) -> float:
        """Fraction of the pool holding cached blocks."""
        return len(self._pool) / self.num_blocks

    def _stored(
        self,
        session_id: str | None,
        hashes: Sequence[int],
        parent: int | None,
        token_ids: Sequence[int],
    ) -> BlockStored:
        """A store as vLLM's KVCacheManager publishes it (tests/interop compares the two):
        one extra-keys entry per block (None: no LoRA, multimodal input or salt), the group
        and its kind."""
        return BlockStored(
            block_hashes=list(hashes),
            parent_block_hash=parent,
            token_ids=list(token_ids),
            block_size=self.block_size,
            lora_id=None,
            medium=self.medium,
            lora_name=None,
            extra_keys=[None] * len(hashes),
            group_idx=GROUP_IDX,
            kv_cache_spec_kind=SPEC_KIND,
            session_id=session_id,
        )

    def _at_frontier(self, session_id: str | None, hashes: Sequence[int], index: int) -> None:
        if session_id is not None:
            self._frontiers[session_id] = (hashes[index], index)

    def _evict(self, count: int, pinned: set[int]) -> Iterable[KVCacheEvent]:
        """Evict `count` least recently used unpinned blocks, one BlockRemoved each."""
        if count <= 0:
            return []
        victims: list[int] = []
        for block in self._pool:
            if block not in pinned:
                victims.append(block)
                if len(victims) == count:
                    break
        for block in victims:
            del self._pool[block]
        return [
            BlockRemoved(block_hashes=[block], medium=self.medium, group_idx=GROUP_IDX)
            for block in victims
        ]

    def _apply_truth(self, events: Iterable[KVCacheEvent]) -> None:
        """Session residency from the events alone, exactly as the index must derive it."""
        for event in events:
            if isinstance(event, BlockStored):
                if event.session_id is None:
                    continue
                self._lost[event.session_id] = 0
                self._stored_at[event.session_id] = self._clock()
                self._stored_at.move_to_end(event.session_id)
                owned = self._sessions.setdefault(event.session_id, set())
                for block in event.block_hashes:
                    assert isinstance(block, int)
                    owned.add(block)
                    self._holders.setdefault(block, set()).add(event.session_id)
            elif isinstance(event, BlockRemoved):
                for block in event.block_hashes:
                    assert isinstance(block, int)
                    for sid in self._holders.pop(block, ()):
                        self._lost[sid] += 1
                        owned = self._sessions[sid]
                        owned.discard(block)
                        if not owned:
                            del self._sessions[sid]
            else:
                for sid, owned in self._sessions.items():
                    self._lost[sid] += len(owned)
                self._sessions.clear()
                self._holders.clear()
