"""Turns (subscriber/turns.py): past the budget of a turn of the event loop, waiting applies
go one a turn, in order, with the loop's socket reads (the API's requests) between them.

The probe for "the loop read its sockets" is a real socket pair kept readable: its reader
is an I/O callback, run once per turn of the loop, as a request's would be.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import pytest
import zmq
import zmq.asyncio

from kvsi.simulator.publisher import SimulatedPublisher
from kvsi.store.memory import MemoryStore
from kvsi.store.model import Batch, Fence, WorkerKey
from kvsi.subscriber import pool as pool_module
from kvsi.subscriber.applier import RUN_MAX
from kvsi.subscriber.gate import StoreGate
from kvsi.subscriber.pool import StreamPool
from kvsi.subscriber.replay import YIELD_EVERY, ReplayClient
from kvsi.subscriber.stream import PublisherSpec, WorkerStream
from kvsi.subscriber.turns import Turns
from tests.subscriber.conftest import FAST
from tests.subscriber.peers import Publisher, payload, stored, tcp
from tests.subscriber.stores import RecordingStore
from tests.waiting import eventually


class SocketReads:
    """Appends "io" to `log` each time the loop runs the reader of an always-readable socket."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self._a, self._b = socket.socketpair()
        self._a.setblocking(False)
        self._b.send(b"x")
        asyncio.get_running_loop().add_reader(self._a, self._read)

    def _read(self) -> None:
        self._a.recv(1)
        self._b.send(b"x")
        self.log.append("io")

    def close(self) -> None:
        asyncio.get_running_loop().remove_reader(self._a)
        self._a.close()
        self._b.close()


@pytest.fixture
async def log() -> AsyncIterator[list[str]]:
    entries: list[str] = []
    reads = SocketReads(entries)
    yield entries
    reads.close()


async def _apply(turns: Turns, name: str, log: list[str], took: float) -> None:
    if not turns.open():
        await turns.wait()
    log.append(name)
    turns.spend(took)


def _applies_between_reads(log: list[str]) -> list[list[str]]:
    """The applies of the log grouped by the socket reads that separate them."""
    groups: list[list[str]] = [[]]
    for entry in log:
        if entry == "io":
            groups.append([])
        else:
            groups[-1].append(entry)
    return [g for g in groups if g]


def test_applies_go_at_once_while_the_budget_lasts() -> None:
    turns = Turns(0.002)
    assert turns.open()
    turns.spend(0.0015)
    assert turns.open()


async def test_past_the_budget_the_waiting_go_one_a_turn_in_order(log: list[str]) -> None:
    turns = Turns(0.002)
    await asyncio.sleep(0)  # the probe's first read
    log.clear()
    names = [f"s{i}" for i in range(6)]
    await asyncio.gather(*(_apply(turns, name, log, 0.001) for name in names))
    groups = _applies_between_reads(log)
    # The first two fit the budget of one turn; every later one has a turn of its own.
    assert groups == [["s0", "s1"], ["s2"], ["s3"], ["s4"], ["s5"]]
    assert turns.open()  # the backlog is through: the next turn has its whole budget


async def test_a_caller_let_go_goes_back_in_line_behind_those_waiting(log: list[str]) -> None:
    """Two backlogs past the budget take turns: one run each a turn, round robin."""
    turns = Turns(0.003)

    async def backlog(name: str) -> None:
        for _ in range(3):
            await _apply(turns, name, log, 0.001)

    await asyncio.sleep(0)
    log.clear()
    streams = [asyncio.create_task(backlog(name)) for name in ("a", "b")]
    turns.spend(0.003)  # both find this turn's budget spent, and wait
    await asyncio.gather(*streams)
    assert _applies_between_reads(log) == [["a"], ["b"], ["a"], ["b"], ["a"], ["b"]]


async def test_a_caller_let_go_holds_the_turn_until_its_budget_is_spent(log: list[str]) -> None:
    """As a stream does with a backlog (`held` once let go, until it pauses): it applies for
    its turn's whole budget, though others wait; they have the next turns, a budget each."""
    turns = Turns(0.003)

    async def backlog(name: str) -> None:
        held = False
        for _ in range(3):
            if not turns.open(held):
                await turns.wait()
                held = True
            log.append(name)
            turns.spend(0.001)

    await asyncio.sleep(0)
    log.clear()
    streams = [asyncio.create_task(backlog(name)) for name in ("a", "b")]
    turns.spend(0.003)
    await asyncio.gather(*streams)
    assert _applies_between_reads(log) == [["a", "a", "a"], ["b", "b", "b"]]


async def test_without_a_budget_every_apply_goes_at_once(log: list[str]) -> None:
    turns = Turns(None)
    await asyncio.sleep(0)
    log.clear()
    names = [f"s{i}" for i in range(6)]
    await asyncio.gather(*(_apply(turns, name, log, 1.0) for name in names))
    assert _applies_between_reads(log) == [names]


async def test_a_caller_cancelled_while_waiting_is_passed_over(log: list[str]) -> None:
    turns = Turns(0.002)
    first = asyncio.create_task(_apply(turns, "first", log, 0.002))
    cancelled = asyncio.create_task(_apply(turns, "cancelled", log, 0.001))
    last = asyncio.create_task(_apply(turns, "last", log, 0.001))
    await asyncio.sleep(0)  # the first spent the turn; the other two wait
    assert [e for e in log if e != "io"] == ["first"]
    cancelled.cancel()
    async with asyncio.timeout(1):
        await asyncio.gather(first, last)
    assert cancelled.cancelled()
    assert [e for e in log if e != "io"] == ["first", "last"]


class LoggedStore(RecordingStore):
    """A RecordingStore that also appends each store call's worker to a shared log, and
    says it applies inline (as the memory store) or not (as Redis)."""

    def __init__(self, log: list[str], *, inline: bool) -> None:
        super().__init__()
        self.log = log
        self.inline = inline

    @property
    def applies_inline(self) -> bool:
        return self.inline

    async def apply(self, worker: WorkerKey, batch: Batch, expect: Fence | None = None) -> Any:
        self.log.append(worker.pod)
        return await super().apply(worker, batch, expect)

    async def apply_many(
        self, worker: WorkerKey, batches: Sequence[Batch], expect: Fence | None = None
    ) -> Any:
        self.log.append(worker.pod)
        return await super().apply_many(worker, batches, expect)


@pytest.mark.parametrize("inline", [True, False], ids=["applies-inline", "suspends"])
async def test_a_pools_streams_with_a_backlog_at_once_apply_one_run_a_turn(
    ctx: zmq.asyncio.Context,
    log: list[str],
    inline: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Six real streams of a StreamPool over real sockets, each publisher sending a backlog
    at once. Over a store that applies inline, the pool's turns give every run (here: every
    one, the budget 0) a turn of the loop of its own, the loop's socket reads between them;
    every batch applied, in order. Over one that suspends, no turns: runs of several streams
    share a turn (what turns prevent, shown here so this can fail)."""
    monkeypatch.setattr(pool_module, "TURN_SECONDS", 0.0)
    store = LoggedStore(log, inline=inline)
    publishers = [Publisher(ctx, tcp(), topic=f"kv@pod-{i}@m".encode()) for i in range(6)]
    specs = [
        PublisherSpec(f"pod-{i}", pub.sock.getsockopt_string(zmq.LAST_ENDPOINT), None)
        for i, pub in enumerate(publishers)
    ]
    pool = StreamPool(specs, store, FAST)
    backlog = 3 * RUN_MAX
    try:
        await pool.start()
        for pub, stream in zip(publishers, pool.streams, strict=True):
            await pub.probe(stream)
        sync = [zmq.Socket.shadow(pub.sock.underlying) for pub in publishers]
        for n in range(backlog):  # no await: every backlog is there at the next turn
            for pub, sock in zip(publishers, sync, strict=True):
                sock.send_multipart([pub.topic, n.to_bytes(8, "big"), payload([stored([n])])])
        log.clear()

        async def applied() -> bool:
            return all(store.seqs(s.worker)[-1:] == [backlog - 1] for s in pool.streams)

        await eventually(applied)
    finally:
        await pool.stop()
        for pub in publishers:
            pub.close()
    for stream in pool.streams:
        assert store.seqs(stream.worker) == list(range(backlog))
    sharing = [g for g in _applies_between_reads(log) if len(g) > 1]
    if inline:
        assert not sharing
    else:
        assert sharing


async def test_replays_with_their_replies_here_go_one_a_turn(
    ctx: zmq.asyncio.Context, log: list[str]
) -> None:
    """Two real replays whose replies are all in their sockets, sharing turns that every
    YIELD_EVERY replies use up: between two socket reads of the loop, only one of them
    delivers."""
    turns = Turns(0.0)
    batches = 4 * YIELD_EVERY
    async with contextlib.AsyncExitStack() as stack:
        publishers = [
            await stack.enter_async_context(
                SimulatedPublisher(
                    "tcp://127.0.0.1:*",
                    replay_endpoint="tcp://127.0.0.1:*",
                    context=ctx,
                    buffer_steps=batches,
                )
            )
            for _ in range(2)
        ]
        for pub in publishers:
            for i in range(batches):
                await pub.publish_payload(pub.encode([stored([i])], ts=100.0 + i))
        delivered = {name: 0 for name in ("a", "b")}

        def deliver_as(name: str) -> Callable[[int, bytes], Awaitable[bool]]:
            async def deliver(seq: int, body: bytes) -> bool:
                if seq == 0:  # meanwhile every other reply reaches the socket
                    await asyncio.sleep(0.5)
                    await turns.wait()  # the replay checks its turn every YIELD_EVERY only
                log.append(name)
                delivered[name] += 1
                return True

            return deliver

        clients = [
            ReplayClient(
                ctx,
                pub.replay_endpoint or "",
                timeout=2.0,
                attempts=1,
                limit=asyncio.Semaphore(2),
                on_drop=lambda _: None,
                turns=turns,
            )
            for pub in publishers
        ]
        await asyncio.gather(
            *(c.fetch(0, deliver_as(n)) for c, n in zip(clients, ("a", "b"), strict=True))
        )
    assert delivered == {"a": batches, "b": batches}
    groups = _applies_between_reads(log)
    assert all(len(set(g)) == 1 for g in groups), [sorted(set(g)) for g in groups]
    assert max(len(g) for g in groups) <= YIELD_EVERY + 1


def _busy(seconds: float) -> None:
    """An apply's CPU, held as the memory store holds the loop."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


async def test_a_stream_that_paused_for_its_upkeep_waits_in_line_again(
    ctx: zmq.asyncio.Context, log: list[str]
) -> None:
    """A real stream's applier loop, let go by the turns, pauses at its loop top (a catch-up
    after a reconnect: replay time, here a sleep) while three backlogs take turns. Back, its
    next runs wait their turn: none of them shares one with another backlog's run."""
    turns = Turns(0.002)
    stream = WorkerStream(
        PublisherSpec("s", "tcp://127.0.0.1:1", None),
        StoreGate(MemoryStore()),
        ctx,
        options=FAST,
        turns=turns,
    )
    applier = stream._applier
    runs = 0

    async def on_live(messages: list[list[bytes]]) -> None:
        nonlocal runs
        runs += 1
        log.append(f"s{runs}")
        _busy(0.0005)
        if runs == 1:
            applier.order.resync = True  # a publisher reconnected: catch up at the loop top

    async def catch_up(why: str) -> None:
        for n in range(4, 40):  # live batches arrive meanwhile
            stream.inbox.put([[b"t", n.to_bytes(8, "big"), b""]], time.monotonic())
        await asyncio.sleep(0.02)
        applier.order.resync = False

    applier.on_live = on_live  # type: ignore[method-assign]
    applier.catch_up = catch_up  # type: ignore[method-assign]
    for n in range(4):
        stream.inbox.put([[b"t", n.to_bytes(8, "big"), b""]], time.monotonic())

    async def backlog(name: str) -> None:  # as a stream whose inbox never empties
        held = False
        while True:
            if not turns.open(held):
                await turns.wait()
                held = True
            started = time.perf_counter()
            _busy(0.001)
            log.append(name)
            turns.spend(time.perf_counter() - started)

    await asyncio.sleep(0)
    log.clear()
    turns.spend(0.002)  # the budget is spent: the stream waits in line first
    others = [asyncio.create_task(backlog(name)) for name in ("a", "b", "c")]
    applying = asyncio.create_task(stream._apply_forever())
    await asyncio.sleep(0.08)
    for task in [applying, *others]:
        task.cancel()
    await asyncio.gather(applying, *others, return_exceptions=True)
    after = [
        g for g in _applies_between_reads(log) if any(e[1:].isdigit() and e != "s1" for e in g)
    ]
    assert after, log  # the stream applied again after its pause
    assert all(all(e.startswith("s") for e in g) for g in after), after
