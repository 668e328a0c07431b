"""Real vLLM 0.33 workers in the test process: its KVCacheManager and ZmqEventPublisher, on CPU.

Imports vLLM (a test module importing this one is skipped without it) and nothing from kvsi's
subscriber, store or API: the service under test learns only what vLLM's own sockets say.
"""

from __future__ import annotations

import socket
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import count
from typing import cast

import pytest

pytest.importorskip("vllm.v1.core.kv_cache_manager", reason="vLLM is not installed (make interop)")

import torch
from vllm.config.kv_events import KVEventsConfig
from vllm.distributed.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventPublisherFactory,
    KVCacheEvent,
    KVEventBatch,
    ZmqEventPublisher,
)
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
from vllm.v1.core.kv_cache_utils import (
    get_block_hash,
    get_request_block_hasher,
    init_none_hash,
    maybe_convert_block_hash,
)
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request, RequestStatus

BLOCK_SIZE = 16
MODEL = "model"
MAX_MODEL_LEN = 8192

REPORT_MODE = "full"
"""vLLM's kv_cache_report_mode for every request: prefix hits are re-announced with the
requesting session (the default, "incremental", announces only new blocks)."""

BIND_WITHIN = 5.0
"""Seconds to wait for a port a closed publisher held: zmq frees it in its I/O thread."""


@dataclass(frozen=True, slots=True)
class Turn:
    """One request: a session's prompt and the tokens the model will answer with."""

    session_id: str
    prompt: list[int]
    output: list[int]


@dataclass(slots=True)
class _Running:
    request: Request
    output: deque[int]


def topic(pod: str) -> str:
    """The topic this project's deployments configure (`kv@<pod>@<model>`)."""
    return f"kv@{pod}@{MODEL}"


def kv_events_config(pod: str, pub_port: int, replay_port: int) -> KVEventsConfig:
    """`--kv-events-config` as this project's deployments set it: vLLM binds both sockets on
    every interface (it binds only `tcp://*:PORT`, `ipc://` and `inproc://`; any other tcp
    endpoint it connects to), and publishes on the pod's topic."""
    return KVEventsConfig(
        enable_kv_cache_events=True,
        publisher="zmq",
        endpoint=f"tcp://*:{pub_port}",
        replay_endpoint=f"tcp://*:{replay_port}",
        topic=topic(pod),
    )


def dialled(endpoint: str, dp_rank: int) -> str:
    """Where a subscriber on this host reaches DP rank `dp_rank` of a tcp `endpoint` of vLLM's
    config: the rank's port, on loopback for a wildcard host."""
    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    return f"tcp://{'127.0.0.1' if host == '*' else host}:{int(port) + dp_rank}"


def kv_cache_config(num_blocks: int) -> KVCacheConfig:
    """One full-attention group of `num_blocks` blocks: a model with one kind of attention."""
    spec = FullAttentionSpec(
        block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32
    )
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["model.layers.0.self_attn"], spec)],
    )


def wait_bindable(*ports: int, within: float = BIND_WITHIN) -> None:
    """Until every port can be bound: vLLM's publisher binds once and raises if busy."""
    deadline = time.monotonic() + within
    while not all(_bindable(port) for port in ports):
        if time.monotonic() > deadline:
            raise AssertionError(f"ports {ports} still busy after {within}s")
        time.sleep(0.02)


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as zmq binds
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return False
        return True


class VllmWorker:
    """One vLLM worker (pod, DP rank), driven the way its scheduler drives it.

    Each `step()` decodes one token of every running request, prefills waiting ones (up to
    `max_running` at once, which keeps every allocation within the pool), frees the finished
    ones and publishes the step's KV events as one batch, as `Scheduler.update_from_output`
    does. vLLM's publisher adds the port offset of the DP rank itself, like `vllm serve`;
    `endpoint` and `replay_endpoint` are where a subscriber on this host reaches them.
    """

    def __init__(
        self,
        pod: str,
        kv_events: KVEventsConfig,
        *,
        dp_rank: int = 0,
        num_blocks: int,
        max_running: int = 2,
    ) -> None:
        """`kv_events` is the engine's `--kv-events-config` (the pod's, rank 0's ports)."""
        init_none_hash(sha256)  # EngineCore does this once at start; idempotent
        self.pod = pod
        self.dp_rank = dp_rank
        self.max_running = max_running
        self.manager = KVCacheManager(
            kv_cache_config(num_blocks),
            max_model_len=MAX_MODEL_LEN,
            scheduler_block_size=BLOCK_SIZE,
            hash_block_size=BLOCK_SIZE,
            enable_caching=True,
            enable_kv_cache_events=True,
        )
        assert kv_events.replay_endpoint is not None, "every deployment here has a replay"
        self.endpoint = dialled(kv_events.endpoint, dp_rank)
        self.replay_endpoint = dialled(kv_events.replay_endpoint, dp_rank)
        wait_bindable(*(int(e.rsplit(":", 1)[1]) for e in (self.endpoint, self.replay_endpoint)))
        # As vLLM's Scheduler builds it: the factory offsets both ports by the DP rank.
        publisher = EventPublisherFactory.create(kv_events, dp_rank)
        assert isinstance(publisher, ZmqEventPublisher), f"{kv_events} publishes nothing"
        self.publisher = publisher
        self.batches = 0
        """Batches published: the last seq the publisher sent is `batches - 1`."""
        self.published: list[KVCacheEvent] = []
        """Every event published, in order."""
        self.prefix_hits = 0
        """Requests that found part of their prompt in the prefix cache."""
        self._hasher = get_request_block_hasher(BLOCK_SIZE, sha256)
        self._ids = count()
        self._waiting: deque[tuple[Request, list[int]]] = deque()
        self._running: list[_Running] = []

    @property
    def idle(self) -> bool:
        return not self._waiting and not self._running

    def submit(self, turn: Turn) -> None:
        """Queue a request; it is prefilled at the next step with room for it."""
        if not turn.output:
            raise ValueError("a request generates at least one token")
        params = SamplingParams(
            max_tokens=len(turn.output), extra_args={"kv_cache_report_mode": REPORT_MODE}
        )
        request = Request(
            f"{self.pod}-{self.dp_rank}-{next(self._ids)}",
            list(turn.prompt),
            params,
            None,
            block_hasher=self._hasher,
            session_id=turn.session_id,
        )
        self._waiting.append((request, list(turn.output)))

    def step(self) -> list[str]:
        """One scheduler step; returns the sessions whose request finished in it."""
        for running in self._running:
            self._allocate(running.request, 1)
            running.request.num_computed_tokens += 1
        while self._waiting and len(self._running) < self.max_running:
            self._running.append(self._prefill(*self._waiting.popleft()))
        finished = [r for r in self._running if self._generate(r)]
        for running in finished:
            running.request.status = RequestStatus.FINISHED_LENGTH_CAPPED
            self.manager.free(running.request)
            self._running.remove(running)
        self._publish(self.manager.take_events())
        return [str(r.request.session_id) for r in finished]

    def run_until_idle(self) -> None:
        """Step until every submitted request has finished."""
        while not self.idle:
            self.step()

    def reset_prefix_cache(self) -> None:
        """vLLM's reset_prefix_cache on an idle engine; its AllBlocksCleared goes out now."""
        if not self.manager.reset_prefix_cache():
            raise AssertionError(f"{self.pod}/{self.dp_rank}: blocks still in use")
        self._publish(self.manager.take_events())

    def copies(self) -> Counter[int | bytes]:
        """Cached blocks per hash in the block pool, in the form vLLM publishes hashes.

        vLLM keeps a second physical block under a hash it recomputed (a prompt that ends on a
        block boundary hits one block less than it holds), so a hash can count twice.
        """
        pool = self.manager.block_pool
        assert not pool.cached_block_hashes_by_block, "partial-block entries are not modelled"
        held = Counter(
            maybe_convert_block_hash(get_block_hash(block.block_hash))
            for block in pool.blocks
            if block.block_hash is not None
        )
        assert len(held) == len(pool.cached_block_hash_to_block)
        return held

    def resident(self) -> set[int | bytes]:
        """Every hash the block pool holds now: what a correct index holds for this worker."""
        return set(self.copies())

    def wait_sent(self, within: float = 5.0) -> None:
        """Until the publisher thread has sent (and buffered for replay) every batch."""
        deadline = time.monotonic() + within
        while self.publisher._event_queue.unfinished_tasks:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.pod}/{self.dp_rank}: batches unsent after {within}s")
            time.sleep(0.01)

    def close(self) -> None:
        """Stop the publisher thread and close its sockets, as an engine shutting down."""
        self.publisher.shutdown()

    def _prefill(self, request: Request, output: Sequence[int]) -> _Running:
        blocks, hit_tokens, _ = self.manager.get_computed_blocks(request)
        if hit_tokens:
            self.prefix_hits += 1
        self._allocate(request, request.num_tokens - hit_tokens, hit_tokens, blocks)
        request.num_computed_tokens = request.num_tokens
        request.status = RequestStatus.RUNNING
        return _Running(request, deque(output))

    def _allocate(
        self, request: Request, tokens: int, hit: int = 0, blocks: KVCacheBlocks | None = None
    ) -> None:
        new = self.manager.allocate_slots(
            request, tokens, num_new_computed_tokens=hit, new_computed_blocks=blocks
        )
        if new is None:
            raise AssertionError(f"{self.pod}/{self.dp_rank}: the pool cannot hold {request}")

    @staticmethod
    def _generate(running: _Running) -> bool:
        """The model's next token for the request; True when it was the last."""
        running.request.append_output_token_ids(running.output.popleft())
        return not running.output

    def _publish(self, events: list[KVCacheEvent]) -> None:
        if not events:
            return  # the scheduler publishes only steps with events
        # take_events is typed with the events' base class; the scheduler batches it as is.
        batch = cast("list[BlockStored | BlockRemoved | AllBlocksCleared]", events)
        self.publisher.publish(KVEventBatch(ts=time.time(), events=batch))
        self.batches += 1
        self.published.extend(events)
