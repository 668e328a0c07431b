"""Dynamo registrations: atomic per (instance, rank), listed in order, removed per rank or all."""

from __future__ import annotations

from kvsi.store.base import IndexStore
from kvsi.store.model import WorkerKey
from kvsi.store.registry import DynamoInstance


def instance(instance_id: int, dp_rank: int = 0, pod: str = "vllm-0") -> DynamoInstance:
    return DynamoInstance(
        instance_id=instance_id,
        dp_rank=dp_rank,
        pod=pod,
        model_name="llama-3-8b",
        routing_group="default",
        block_size=16,
        endpoint=f"tcp://127.0.0.1:{5557 + dp_rank}",
    )


BIG = 2**64 - 1
"""Instance ids are u64 lease ids: above 2^63 too."""


async def test_a_registration_is_recorded_once_and_listed_in_id_then_rank_order(
    store: IndexStore,
) -> None:
    assert await store.instances() == []
    for reg in (instance(BIG, 1, "vllm-9"), instance(7, 1), instance(7, 0), instance(BIG)):
        assert await store.register_instance(reg) is None

    listed = await store.instances()

    assert [(i.instance_id, i.dp_rank) for i in listed] == [(7, 0), (7, 1), (BIG, 0), (BIG, 1)]
    assert listed[3] == instance(BIG, 1, "vllm-9")
    assert listed[3].worker == WorkerKey("vllm-9", 1)


async def test_a_taken_rank_answers_the_registration_in_the_way_and_changes_nothing(
    store: IndexStore,
) -> None:
    first = instance(7)
    assert await store.register_instance(first) is None
    other = DynamoInstance(7, 0, "vllm-1", "mistral", "customer-a", 32, "tcp://10.0.0.1:1")

    assert await store.register_instance(other) == first
    assert await store.register_instance(other) == first
    assert await store.instances() == [first]


async def test_unregistering_removes_one_rank_or_every_rank_of_the_instance(
    store: IndexStore,
) -> None:
    for reg in (instance(7, 0), instance(7, 1), instance(7, 2), instance(8)):
        await store.register_instance(reg)

    assert await store.unregister_instance(7, 1) == [instance(7, 1)]
    assert await store.unregister_instance(7, 1) == []
    assert await store.unregister_instance(9, None) == []
    assert await store.unregister_instance(7, None) == [instance(7, 0), instance(7, 2)]

    assert await store.instances() == [instance(8)]
    assert await store.register_instance(instance(7, 1)) is None
