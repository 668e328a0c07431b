"""ReplayClient against real ROUTERs: both framings, late buffers, timeouts, retries, bounds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import zmq.asyncio
from prometheus_client import REGISTRY

from kvsi.simulator.publisher import SimulatedPublisher
from kvsi.subscriber.drops import DropReason
from kvsi.subscriber.replay import QUIET_SECONDS, YIELD_EVERY, ReplayClient, ReplayFailedError
from tests.subscriber.peers import Publisher, ReplayRouter, payload, stored, tcp


@pytest.fixture
async def ctx() -> AsyncIterator[zmq.asyncio.Context]:
    context = zmq.asyncio.Context()
    try:
        yield context
    finally:
        context.destroy(linger=0)


class Collect:
    """A deliver callback that keeps what it got and can stop at a seq."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.got: list[tuple[int, bytes]] = []
        self.stop_at = stop_at

    async def __call__(self, seq: int, body: bytes) -> bool:
        self.got.append((seq, body))
        return seq != self.stop_at

    @property
    def seqs(self) -> list[int]:
        return [seq for seq, _ in self.got]


def client(
    ctx: zmq.asyncio.Context,
    endpoint: str,
    *,
    timeout: float = 1.0,
    attempts: int = 3,
    limit: asyncio.Semaphore | None = None,
    drops: list[DropReason] | None = None,
) -> ReplayClient:
    return ReplayClient(
        ctx,
        endpoint,
        timeout=timeout,
        attempts=attempts,
        limit=limit or asyncio.Semaphore(4),
        on_drop=(drops if drops is not None else []).append,
    )


@pytest.mark.parametrize("legacy", [False, True], ids=["0.26+", "pre-0.26"])
async def test_replay_returns_every_buffered_batch_from_start_in_both_framings(
    ctx: zmq.asyncio.Context, legacy: bool
) -> None:
    async with SimulatedPublisher(
        "tcp://127.0.0.1:*",
        replay_endpoint="tcp://127.0.0.1:*",
        legacy_replay_framing=legacy,
        context=ctx,
    ) as publisher:
        bodies = [publisher.encode([stored([i])], ts=100.0 + i) for i in range(10)]
        for body in bodies:
            await publisher.publish_payload(body)
        assert publisher.replay_endpoint is not None
        got = Collect()
        count = REGISTRY.get_sample_value("kvsi_replay_seconds_count") or 0.0
        report = await client(ctx, publisher.replay_endpoint).fetch(3, got)
    assert got.got == [(seq, bodies[seq]) for seq in range(3, 10)]
    assert (report.first_seq, report.last_seq, report.batches, report.attempts) == (3, 9, 7, 1)
    assert not report.stopped
    assert REGISTRY.get_sample_value("kvsi_replay_seconds_count") == count + 1


async def test_a_buffer_that_no_longer_reaches_back_starts_late(ctx: zmq.asyncio.Context) -> None:
    async with SimulatedPublisher(
        "tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", buffer_steps=4, context=ctx
    ) as publisher:
        for i in range(10):
            await publisher.publish([stored([i])])
        assert publisher.replay_endpoint is not None
        got = Collect()
        report = await client(ctx, publisher.replay_endpoint).fetch(0, got)
    assert got.seqs == [6, 7, 8, 9]
    assert report.first_seq == 6 and report.start == 0


async def test_a_silent_endpoint_fails_after_the_bounded_attempts(
    ctx: zmq.asyncio.Context,
) -> None:
    endpoint = tcp()
    router = ReplayRouter(ctx, endpoint, Publisher(ctx, tcp()))
    router.silent = True
    router.start()
    began = time.monotonic()
    try:
        with pytest.raises(ReplayFailedError, match="after 3 attempts") as failed:
            await client(ctx, endpoint, timeout=0.1, attempts=3).fetch(5, Collect())
    finally:
        await router.close()
        router.publisher.close()
    assert failed.value.reason == "timeout"
    assert failed.value.report.attempts == 3
    assert router.requests == [5, 5, 5]
    assert time.monotonic() - began < 2.0


async def test_a_reply_with_a_hole_is_retried_from_after_the_last_delivered_batch(
    ctx: zmq.asyncio.Context,
) -> None:
    publisher = Publisher(ctx, tcp())
    for i in range(8):
        await publisher.send(payload([stored([i])]), deliver=False)
    endpoint = tcp()
    router = ReplayRouter(ctx, endpoint, publisher)
    router.skips = [{4}]
    router.start()
    got = Collect()
    try:
        report = await client(ctx, endpoint).fetch(0, got)
    finally:
        await router.close()
        publisher.close()
    assert got.seqs == list(range(8))
    assert router.requests == [0, 4]
    assert report.attempts == 2


async def test_an_end_marker_lost_after_replies_asks_again_without_waiting_out_the_timeout(
    ctx: zmq.asyncio.Context,
) -> None:
    """The ROUTER drops the end marker (its high-water mark, right after the burst): the
    silence after the replies ends the attempt, and the next one from after the last reply
    gets the marker. The reply timeout (a minute here) is never waited out."""
    publisher = Publisher(ctx, tcp())
    for i in range(8):
        await publisher.send(payload([stored([i])]), deliver=False)
    endpoint = tcp()
    router = ReplayRouter(ctx, endpoint, publisher)
    router.lost_ends = 1
    router.start()
    got = Collect()
    try:
        async with asyncio.timeout(30):
            report = await client(ctx, endpoint, timeout=60.0).fetch(0, got)
    finally:
        await router.close()
        publisher.close()
    assert got.seqs == list(range(8))
    assert router.requests == [0, 8]
    assert report.attempts == 2
    assert QUIET_SECONDS < 60.0


async def test_no_reply_at_all_waits_the_whole_timeout_before_asking_again(
    ctx: zmq.asyncio.Context,
) -> None:
    """Before the first reply the quiet rule does not apply: a slow engine gets the timeout."""
    publisher = Publisher(ctx, tcp())
    await publisher.send(payload([stored([1])]), deliver=False)
    endpoint = tcp()
    router = ReplayRouter(ctx, endpoint, publisher, delay=QUIET_SECONDS * 2)
    router.start()
    got = Collect()
    try:
        report = await client(ctx, endpoint, timeout=QUIET_SECONDS * 20).fetch(0, got)
    finally:
        await router.close()
        publisher.close()
    assert got.seqs == [0]
    assert router.requests == [0]
    assert report.attempts == 1


async def test_bad_reply_frames_are_counted_and_skipped(ctx: zmq.asyncio.Context) -> None:
    publisher = Publisher(ctx, tcp())
    for i in range(3):
        await publisher.send(payload([stored([i])]), deliver=False)
    endpoint = tcp()
    router = ReplayRouter(ctx, endpoint, publisher, legacy=True)
    router.junk = [[b"x", b"\x00" * 8, b"p"], [b"", b"\x00" * 3, b"p"], [b""]]
    router.start()
    drops: list[DropReason] = []
    got = Collect()
    try:
        await client(ctx, endpoint, drops=drops).fetch(0, got)
    finally:
        await router.close()
        publisher.close()
    assert got.seqs == [0, 1, 2]
    assert drops == [DropReason.REPLY_DELIMITER, DropReason.SEQ_FRAME, DropReason.FRAME_COUNT]


async def test_deliver_returning_false_stops_the_replay(ctx: zmq.asyncio.Context) -> None:
    publisher = Publisher(ctx, tcp())
    for i in range(6):
        await publisher.send(payload([stored([i])]), deliver=False)
    endpoint = tcp()
    router = ReplayRouter(ctx, endpoint, publisher)
    router.start()
    got = Collect(stop_at=2)
    try:
        report = await client(ctx, endpoint).fetch(0, got)
    finally:
        await router.close()
        publisher.close()
    assert got.seqs == [0, 1, 2]
    assert report.stopped


@pytest.mark.parametrize("bound", [1, 2])
async def test_concurrent_replays_never_exceed_the_shared_bound(
    ctx: zmq.asyncio.Context, bound: int
) -> None:
    publisher = Publisher(ctx, tcp())
    for i in range(4):
        await publisher.send(payload([stored([i])]), deliver=False)
    endpoint = tcp()
    router = ReplayRouter(ctx, endpoint, publisher, delay=0.02)
    router.start()
    limit = asyncio.Semaphore(bound)
    try:
        results = [Collect() for _ in range(4)]
        await asyncio.gather(*(client(ctx, endpoint, limit=limit).fetch(0, got) for got in results))
    finally:
        await router.close()
        publisher.close()
    assert all(got.seqs == [0, 1, 2, 3] for got in results)
    assert router.most_active == bound


async def test_a_long_replay_already_received_still_lets_the_loop_run_other_tasks(
    ctx: zmq.asyncio.Context,
) -> None:
    """Replies waiting in the socket are read without waiting, but the loop gets a turn every
    YIELD_EVERY of them: a 10,000-batch replay must not hold the other streams and the API."""
    batches = 10 * YIELD_EVERY
    async with SimulatedPublisher(
        "tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", context=ctx, buffer_steps=batches
    ) as publisher:
        for i in range(batches):
            await publisher.publish_payload(publisher.encode([stored([i])], ts=100.0 + i))
        assert publisher.replay_endpoint is not None
        turns = 0

        async def ticker() -> None:
            nonlocal turns
            while True:
                turns += 1
                await asyncio.sleep(0)

        seen: list[int] = []

        async def deliver(seq: int, body: bytes) -> bool:
            if seq == 0:  # meanwhile every other reply reaches the socket
                await asyncio.sleep(1.0)
            seen.append(turns)
            return True

        ticking = asyncio.create_task(ticker())
        try:
            await client(ctx, publisher.replay_endpoint).fetch(0, deliver)
        finally:
            ticking.cancel()
    assert len(seen) == batches
    later = seen[1:]
    assert later[-1] - later[0] >= len(later) // YIELD_EVERY - 1


async def test_holes_after_progress_do_not_use_up_the_attempts(
    ctx: zmq.asyncio.Context,
) -> None:
    """A ROUTER at its high-water mark drops replies again and again while the store is slow:
    each retry resumes after what arrived, and only attempts that deliver nothing count."""
    publisher = Publisher(ctx, tcp())
    for i in range(10):
        await publisher.send(payload([stored([i])]), deliver=False)
    endpoint = tcp()
    router = ReplayRouter(ctx, endpoint, publisher)
    router.skips = [{2}, {4}, {6}, {8}]
    router.start()
    got = Collect()
    try:
        report = await client(ctx, endpoint, attempts=2).fetch(0, got)
    finally:
        await router.close()
        publisher.close()
    assert got.seqs == list(range(10))
    assert router.requests == [0, 2, 4, 6, 8]
    assert report.attempts == 5
