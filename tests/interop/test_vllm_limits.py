"""What vLLM's events cannot tell, shown on its real block pool (DESIGN.md, set semantics).

A prompt that ends on a block boundary hits one block less than the pool holds: vLLM
recomputes the last block into a second physical block under the same hash. When one copy
is evicted, its BlockRemoved empties the entry although the other copy stays: the index
under-reports that hash (never over-reports) until vLLM stores or reports it again.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from tests.e2e.truth import listing
from tests.interop.conftest import StartSidecar
from tests.interop.engines import BLOCK_SIZE, Turn, VllmWorker, kv_events_config
from tests.interop.truth import caught_up, mismatches
from tests.ports import free_port_run
from tests.waiting import eventually

pytestmark = pytest.mark.interop


@pytest.fixture
def worker() -> Iterator[VllmWorker]:
    """One worker with 7 usable blocks (block 0 is vLLM's null block)."""
    port = free_port_run(2)
    worker = VllmWorker("pod-a", kv_events_config("pod-a", port, port + 1), num_blocks=8)
    try:
        yield worker
    finally:
        worker.close()


def tokens(blocks: int, rng: random.Random) -> list[int]:
    return [rng.randrange(100, 32_000) for _ in range(blocks * BLOCK_SIZE)]


def serve(worker: VllmWorker, turn: Turn) -> None:
    worker.submit(turn)
    worker.run_until_idle()


async def test_a_hash_held_twice_and_evicted_once_is_under_reported_until_reported_again(
    worker: VllmWorker, sidecars: StartSidecar
) -> None:
    sidecar = await sidecars({("pod-a", 0): worker})
    await sidecar.wait_states({"pod-a": "live"})
    workers = {("pod-a", 0): worker}
    rng = random.Random(1)
    prompt = tokens(2, rng)
    serve(worker, Turn("sess-a", prompt, [1]))
    serve(worker, Turn("sess-b", prompt, [2]))  # hits 1 block, recomputes the 2nd
    (second,) = [block for block, copies in worker.copies().items() if copies == 2]
    await eventually(lambda: caught_up(sidecar.client, workers))
    assert await mismatches(sidecar.client, workers) == []

    serve(worker, Turn("sess-c", tokens(5, rng), [3]))  # evicts the older copy only
    assert worker.copies()[second] == 1
    await eventually(lambda: caught_up(sidecar.client, workers))
    indexed = await listing(sidecar.client, "/v1/pods/pod-a/blocks")
    assert worker.resident() - indexed == {second}
    assert indexed <= worker.resident()

    serve(worker, Turn("sess-d", [*prompt, *tokens(1, rng)], [4]))  # reports both blocks
    await eventually(lambda: caught_up(sidecar.client, workers))
    assert await mismatches(sidecar.client, workers) == []
    assert second in await listing(sidecar.client, "/v1/sessions/sess-d/blocks")
