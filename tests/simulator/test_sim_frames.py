"""The simulator's live and replay frames are byte for byte those captured from vLLM."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
import zmq.asyncio

from kvsi.simulator.publisher import SimulatedPublisher
from tests.simulator.peers import (
    batch_from_expected,
    fixture_hex,
    frames_hex,
    load_frames,
    recv,
    replay,
    subscribe,
)

pytestmark = pytest.mark.timeout(30)

LOOPBACK = "tcp://127.0.0.1:*"


def test_expected_batches_encode_to_the_captured_0_33_payloads() -> None:
    """Events built the way the engine builds them encode exactly as vLLM 0.33 encodes them."""
    capture = load_frames("capture_0.33.0.json")
    encoder = msgspec.msgpack.Encoder()
    for message in capture["sub_received"]:
        batch = batch_from_expected(message["expected"])
        payload = message["frames"][2]
        assert encoder.encode(batch).hex() == payload["hex"], message["seq"]
        assert len(encoder.encode(batch)) == payload["len"]


def test_publisher_encode_stamps_rank_and_ts_like_vllm() -> None:
    capture = load_frames("capture_0.33.0.json")
    message = capture["sub_received"][0]  # data_parallel_rank 0
    batch = batch_from_expected(message["expected"])
    publisher = SimulatedPublisher(LOOPBACK, data_parallel_rank=0)
    assert publisher.encode(batch.events, ts=batch.ts).hex() == message["frames"][2]["hex"]


async def _replay_capture(
    ctx: zmq.asyncio.Context,
    capture: dict[str, Any],
    publisher: SimulatedPublisher,
    *,
    raw: bool,
) -> None:
    """Publish the capture's batches, compare what a SUB and a DEALER get with the capture."""
    sub = await subscribe(ctx, publisher)
    try:
        for message in capture["sub_received"]:
            if raw:
                seq = await publisher.publish_payload(bytes.fromhex(message["frames"][2]["hex"]))
            else:
                seq = await publisher.publish_batch(batch_from_expected(message["expected"]))
            assert seq == message["seq"]
            received = await recv(sub)
            assert frames_hex(received) == fixture_hex(message["frames"])
            assert [len(f) for f in received] == [f["len"] for f in message["frames"]]
    finally:
        sub.close(linger=0)
    assert publisher.replay_endpoint is not None
    for exchange in capture["dealer_exchanges"]:
        request = [bytes.fromhex(f["hex"]) for f in exchange["request_sent_by_dealer"]]
        replies = await replay(ctx, publisher.replay_endpoint, request)
        expected = exchange["replies_received_by_dealer"]
        assert [frames_hex(r) for r in replies] == [fixture_hex(r["frames"]) for r in expected]


async def test_live_and_replay_frames_match_the_vllm_0_33_capture(
    ctx: zmq.asyncio.Context,
) -> None:
    capture = load_frames("capture_0.33.0.json")
    pod, model = capture["topic"].split("@")[1:]
    async with SimulatedPublisher(
        LOOPBACK, replay_endpoint=LOOPBACK, pod=pod, model=model, context=ctx
    ) as publisher:
        assert publisher.topic == capture["topic"]
        await _replay_capture(ctx, capture, publisher, raw=False)


async def test_legacy_replay_framing_matches_the_vllm_0_25_capture(
    ctx: zmq.asyncio.Context,
) -> None:
    """Pre-0.26 replies: no topic frame, end marker ["", ff*8, ""] (payloads sent as captured)."""
    capture = load_frames("capture_0.25.0.json")
    async with SimulatedPublisher(
        LOOPBACK,
        replay_endpoint=LOOPBACK,
        topic=capture["topic"],
        legacy_replay_framing=True,
        context=ctx,
    ) as publisher:
        await _replay_capture(ctx, capture, publisher, raw=True)


async def test_frame_roles_match_the_standalone_frame_fixtures(ctx: zmq.asyncio.Context) -> None:
    """live_message, replay_request and replay_reply_0.26+ describe the same exchange."""
    live = load_frames("live_message.json")
    request = load_frames("replay_request.json")
    reply = load_frames("replay_reply_0.26+.json")
    capture = load_frames("capture_0.33.0.json")
    by_seq = {m["seq"]: m for m in capture["sub_received"]}
    async with SimulatedPublisher(
        LOOPBACK, replay_endpoint=LOOPBACK, topic=live["frames"][0]["text"], context=ctx
    ) as publisher:
        sub = await subscribe(ctx, publisher)
        try:
            for seq in range(8):
                await publisher.publish_batch(batch_from_expected(by_seq[seq]["expected"]))
                received = await recv(sub)
        finally:
            sub.close(linger=0)
        assert frames_hex(received) == fixture_hex(live["frames"])  # seq 7
        assert publisher.replay_endpoint is not None
        replies = await replay(
            ctx,
            publisher.replay_endpoint,
            [bytes.fromhex(f["hex"]) for f in request["frames"]],
        )
    assert frames_hex(replies[0]) == fixture_hex(reply["reply"]["frames"])
    assert frames_hex(replies[-1]) == fixture_hex(reply["end_marker"]["frames"])
    assert [f["role"] for f in reply["reply"]["frames"]] == ["delimiter", "topic", "seq", "payload"]
    assert len(replies) == 4  # seqs 5, 6, 7 and the end marker
