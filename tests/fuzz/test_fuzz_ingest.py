"""Bad frames, fuzzed: no crash, every message accounted for by reason, a bad event skips only
itself. The bulk drives the stream's message handler directly (over 100,000 messages); a
smaller part goes through real sockets.

A message ends exactly one way: a whole-message drop (framing, unreadable or unusable batch)
or one batch outcome (applied, duplicate, previous engine, restarted); event drops come on
top of a batch outcome.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import msgspec
import pytest
import structlog
import zmq
import zmq.asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsi.store.memory import MemoryStore
from kvsi.store.model import WorkerKey
from kvsi.subscriber import wire
from kvsi.subscriber.decode import ingest_decoder, wire_decoder
from kvsi.subscriber.drops import MESSAGE_REASONS, DropReason
from kvsi.subscriber.gate import StoreGate
from kvsi.subscriber.stream import PublisherSpec, WorkerStream
from tests.fuzz.corpus import BAD_EVENTS, ENCODER, TOPIC, Mutator, messages, seq_frame
from tests.subscriber.peers import Publisher, running, tcp
from tests.waiting import eventually

BULK_EXAMPLES = 110
BULK_MESSAGES = 1_000
"""110 seeds x 1,000 messages: over 100,000 fuzzed messages, in bounded time."""

TEN_MB = 10 * 1024 * 1024


@pytest.fixture(autouse=True)
def quiet_logs() -> Iterator[None]:
    """Gaps and losses are logged at warning, and fuzzing makes thousands of them."""
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    try:
        yield
    finally:
        structlog.configure(**saved)


@pytest.fixture(scope="module")
def ctx() -> Iterator[zmq.asyncio.Context]:
    context = zmq.asyncio.Context()
    try:
        yield context
    finally:
        context.destroy(linger=0)


def new_stream(ctx: zmq.asyncio.Context, endpoint: str = "tcp://127.0.0.1:9") -> WorkerStream:
    """A stream with no replay endpoint: every gap takes the unrecoverable path too."""
    return WorkerStream(PublisherSpec("pod-a", endpoint), StoreGate(MemoryStore()), ctx)


def assert_accounted(stream: WorkerStream, sent: int) -> None:
    c = stream.counters
    whole = sum(n for reason, n in c.drops.items() if reason in MESSAGE_REASONS)
    assert c.messages == sent
    assert whole + sum(c.batches.values()) == sent, (c.drops, c.batches)


async def assert_store_readable(stream: WorkerStream) -> None:
    store = stream._gate.store
    for worker in await store.list_workers():
        page = await store.worker_blocks(
            worker.pod, dp_rank=worker.dp_rank, medium=None, limit=1000, cursor=None
        )
        assert page is not None and len(page.items) <= worker.blocks  # a hash may sit in two groups


async def feed(stream: WorkerStream, batch: list[list[bytes]]) -> None:
    for frames in batch:
        await stream.on_message(frames)


def test_over_100k_fuzzed_messages_never_crash_and_are_all_accounted(
    ctx: zmq.asyncio.Context,
) -> None:
    total = 0
    reasons: set[str] = set()

    @settings(
        max_examples=BULK_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(st.integers(0, 2**32 - 1))
    def run(seed: int) -> None:
        nonlocal total
        mutator = Mutator(seed)
        batch = [mutator.next() for _ in range(BULK_MESSAGES)]
        stream = new_stream(ctx)
        asyncio.run(feed(stream, batch))
        assert_accounted(stream, len(batch))
        asyncio.run(assert_store_readable(stream))
        total += len(batch)
        reasons.update(stream.counters.drops)

    began = time.monotonic()
    run()
    assert total >= 100_000
    # Every reason the input can cause; not apply_error, which only a store's bug causes: no
    # fuzzed message made the store raise.
    assert DropReason.APPLY_ERROR not in reasons
    assert reasons >= {r.value for r in DropReason} - {
        DropReason.REPLY_DELIMITER,
        DropReason.APPLY_ERROR,
    }
    assert time.monotonic() - began < 120


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(messages(), min_size=1, max_size=40))
def test_hypothesis_shaped_messages_never_crash_and_are_all_accounted(
    ctx: zmq.asyncio.Context, batch: list[list[bytes]]
) -> None:
    stream = new_stream(ctx)
    asyncio.run(feed(stream, batch))
    assert_accounted(stream, len(batch))
    asyncio.run(assert_store_readable(stream))


def good_stored(index: int) -> dict[str, Any]:
    return {
        "type": "BlockStored",
        "block_hashes": [1000 + index, 2**64 - 1 - index],
        "parent_block_hash": None,
        "token_ids": [1] * 32,
        "block_size": 16,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "session_id": f"s{index}",
    }


@settings(max_examples=300, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=12), st.data())
def test_a_bad_event_skips_only_itself(
    ctx: zmq.asyncio.Context, good: list[bool], data: st.DataObject
) -> None:
    events = [good_stored(i) if ok else data.draw(BAD_EVENTS) for i, ok in enumerate(good)]
    payload = msgspec.msgpack.encode([1.5, events, 0])
    stream = new_stream(ctx)
    asyncio.run(stream.on_message([TOPIC, seq_frame(0), payload]))
    event_drops = {r: n for r, n in stream.counters.drops.items() if r not in MESSAGE_REASONS}
    assert sum(event_drops.values()) == good.count(False)
    assert set(event_drops) <= {DropReason.UNKNOWN_EVENT, DropReason.MALFORMED_EVENT}

    async def held() -> set[int | bytes]:
        page = await stream._gate.store.worker_blocks(
            "pod-a", dp_rank=0, medium=None, limit=1000, cursor=None
        )
        return set(page.items) if page else set()

    want = {h for i, ok in enumerate(good) if ok for h in good_stored(i)["block_hashes"]}
    assert asyncio.run(held()) == want


def big_valid_batch(seed: int) -> bytes:
    """About 10 MB, nearly all token ids (which ingest reads past), a few blocks."""
    event = wire.BlockStored(
        block_hashes=[2 * seed, 2 * seed + 1],
        parent_block_hash=None,
        token_ids=list(range(TEN_MB // 4)),
        block_size=16,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        session_id="big",
    )
    return ENCODER.encode(wire.KVEventBatch(ts=2e9 + seed, events=[event], data_parallel_rank=0))


async def test_ten_megabyte_payloads_are_read_or_skipped_in_bounded_time(
    ctx: zmq.asyncio.Context,
) -> None:
    stream = new_stream(ctx)
    valid = big_valid_batch(0)
    assert len(valid) >= TEN_MB
    cases = [
        os.urandom(TEN_MB),
        valid,
        valid[: len(valid) // 2],
        b"\x93" + msgspec.msgpack.encode(1.0) + b"\x91" + b"\x91" * TEN_MB,
        msgspec.msgpack.encode([1.0, [os.urandom(1024) for _ in range(TEN_MB // 1024)], 0]),
        big_valid_batch(1),
    ]
    began = time.monotonic()
    for seq, body in enumerate(cases):
        await stream.on_message([TOPIC, seq_frame(seq), body])
    assert time.monotonic() - began < 10
    assert_accounted(stream, len(cases))
    view = await stream._gate.store.get_session("big")
    assert view is not None and view.total_blocks == 4


@pytest.fixture
async def socket_ctx() -> AsyncIterator[zmq.asyncio.Context]:
    context = zmq.asyncio.Context()
    try:
        yield context
    finally:
        context.destroy(linger=0)


async def test_fuzzed_frames_through_real_sockets_leave_the_stream_working(
    socket_ctx: zmq.asyncio.Context,
) -> None:
    publisher = Publisher(socket_ctx, tcp(), topic=TOPIC)
    stream = new_stream(socket_ctx, publisher.sock.getsockopt_string(zmq.LAST_ENDPOINT))
    mutator = Mutator(2024)
    try:
        async with running(stream):
            await publisher.probe(stream)
            sent = 0
            for i in range(5_000):
                frames = mutator.next()
                if not frames:
                    continue  # ZMQ has no zero-frame message
                await publisher.sock.send_multipart(frames)
                sent += 1
                if i % 200 == 0:
                    await asyncio.sleep(0)
            for body in (os.urandom(TEN_MB), big_valid_batch(7)):
                await publisher.sock.send_multipart([TOPIC, seq_frame(10**9), body])
                sent += 1

            async def all_handled() -> bool:
                return stream.counters.messages == sent

            await eventually(all_handled, within=30)
            assert_accounted(stream, sent)
            fence = stream.fence
            seq = 0 if fence is None else fence.seq + 1
            ts = 1.0 if fence is None else max(fence.epoch_ts, fence.last_ts)
            sentinel = ENCODER.encode(
                wire.KVEventBatch(
                    ts=ts,
                    events=[
                        wire.BlockStored(
                            block_hashes=[424242],
                            parent_block_hash=None,
                            token_ids=[],
                            block_size=16,
                            lora_id=None,
                            medium="GPU",
                            lora_name=None,
                            session_id="sentinel",
                        )
                    ],
                    data_parallel_rank=stream.worker.dp_rank,
                )
            )
            await publisher.sock.send_multipart([TOPIC, seq_frame(seq), sentinel])

            async def sentinel_applied() -> bool:
                view = await stream._gate.store.get_session("sentinel")
                return view is not None and view.total_blocks == 1

            await eventually(sentinel_applied)
            assert stream.worker.pod == "pod-a" and isinstance(stream.worker, WorkerKey)
    finally:
        publisher.close()


def test_payloads_the_fuzzers_found_that_used_to_raise() -> None:
    """Each of these once escaped the decoder and would have stopped a stream."""
    batch_of = b"\x92" + msgspec.msgpack.encode(1.0) + b"\x91"
    found = {
        "a string that is not UTF-8": batch_of + b"\x81\xa4type\xa4\xff\xfe\xfd\xfc",
        "a timestamp extension of a bad length": batch_of + b"\xc7\x03\xff\x00\x00\x00",
        "an event nested 2,000 deep": batch_of + b"\x91" * 2_000 + b"\x01",
    }
    for decoder in (ingest_decoder(), wire_decoder()):
        for what, body in found.items():
            decoded = decoder.decode(body)
            assert decoded.dropped, what
