"""The sizing model (kvsi/sizing.py): tables of fleets in, plans out; and deploy/SIZING.md's
worked example is what `kvsi size` prints now, run as a real process."""

from __future__ import annotations

import dataclasses
import math
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from kvsi.sizing import (
    FEED_LENGTH,
    GIB,
    MEASURED,
    Budget,
    Fleet,
    Plan,
    cluster_shards,
    describe,
    fewest,
    light_load,
    plan,
    render,
    units,
)
from kvsi.store.redis import mirror

SIZING_DOC = Path(__file__).resolve().parents[2] / "deploy" / "SIZING.md"

BASE = Fleet(
    workers=100,
    entries=10_000_000,
    sessions=100_000,
    blocks_per_worker=100_000,
    event_rate=100_000,
    query_rate=1_000,
)

GROWS: list[tuple[str, list[str]]] = [
    # (input doubled, what must grow with it; nothing else may shrink)
    ("workers", ["redis_bytes", "api_cores"]),
    ("entries", ["redis_bytes", "mirror_bytes", "memory_store_bytes"]),
    ("sessions", ["redis_bytes"]),
    ("blocks_per_worker", ["redis_bytes"]),
    ("event_rate", ["redis_cores", "ingest_cores", "memory_store_cores"]),
    ("query_rate", ["redis_cores", "api_cores", "memory_store_cores"]),
]

SIZES = (
    "shards",
    "shards_for_memory",
    "shards_for_cpu",
    "redis_bytes",
    "redis_cores",
    "ingest_cores",
    "ingest_processes",
    "mirror_bytes",
    "api_cores",
    "api_processes",
    "memory_store_bytes",
    "memory_store_cores",
)


@pytest.mark.parametrize(("name", "grows"), GROWS, ids=[g[0] for g in GROWS])
def test_the_plan_is_monotonic_in_each_input(name: str, grows: list[str]) -> None:
    small = plan(BASE)
    for factor in (2, 10, 100):
        bigger = dataclasses.replace(BASE, **{name: getattr(BASE, name) * factor})
        large = plan(bigger)
        for size in SIZES:
            assert getattr(large, size) >= getattr(small, size), (name, factor, size)
        for size in grows:
            assert getattr(large, size) > getattr(small, size), (name, factor, size)
        small = large


@pytest.mark.parametrize(("needed", "shards"), [(0, 1), (1, 1), (2, 3), (3, 3), (4, 4), (22, 22)])
def test_a_cluster_has_at_least_three_masters(needed: int, shards: int) -> None:
    assert cluster_shards(needed) == shards


@pytest.mark.parametrize(
    ("load", "per_unit", "count"),
    [(0.0, 0.5, 1), (0.5, 0.5, 1), (0.5000001, 0.5, 2), (1.5, 0.5, 3), (3 * 0.1, 0.1, 3)],
)
def test_units_round_up_but_not_past_an_exact_fit(load: float, per_unit: float, count: int) -> None:
    assert units(load, per_unit) == count


def quiet(fleet: Fleet) -> Fleet:
    return dataclasses.replace(fleet, event_rate=0, query_rate=0)


def test_shards_for_memory_follow_the_shard_size() -> None:
    fleet = quiet(BASE)
    planned = MEASURED.redis_bytes(fleet) * Budget().memory_headroom
    exact = Budget(shard_memory_gib=planned / GIB)
    assert plan(fleet, exact).shards == 1
    assert (
        plan(fleet, dataclasses.replace(exact, shard_memory_gib=planned / GIB / 1.01)).shards == 3
    )
    assert plan(fleet, dataclasses.replace(exact, shard_memory_gib=planned / GIB / 5)).shards == 5


@pytest.mark.parametrize("shards", [1, 3, 7])
def test_memory_per_shard_is_the_index_over_the_shards(shards: int) -> None:
    sized = plan(BASE, shards=shards)
    assert sized.shards == shards
    [limit] = [b for b in sized.bottlenecks if b.name == "Redis memory per shard"]
    assert limit.load == pytest.approx(sized.redis_bytes / shards / GIB)
    assert limit.capacity == Budget().shard_memory_gib
    [cpu] = [b for b in sized.bottlenecks if b.name == "Redis CPU per shard"]
    assert cpu.load == pytest.approx(sized.redis_cores / shards)


@pytest.mark.parametrize(
    "fleet",
    [
        dataclasses.replace(BASE, event_rate=3_000_000, query_rate=20_000),
        # light: each unit rests between applies, and a cluster's three masters rest more
        dataclasses.replace(BASE, workers=50, event_rate=20_000, query_rate=100),
        dataclasses.replace(BASE, workers=2_000, event_rate=200_000, query_rate=100),
    ],
    ids=["busy", "light", "many-resting-streams"],
)
def test_the_planned_units_keep_each_bottleneck_within_the_budget(fleet: Fleet) -> None:
    budget = Budget(cpu_share=0.4)
    sized = plan(fleet, budget)
    for limit in sized.bottlenecks:
        if limit.unit == "cores" and "sidecar" not in limit.name:
            assert limit.load <= budget.cpu_share + 1e-9, limit
            assert limit.headroom >= 1 / budget.cpu_share - 1e-9, limit


def test_no_load_is_one_of_everything_and_the_streams_upkeep() -> None:
    """No events and no routes: one of each unit; Redis and ingest still carry each followed
    worker's audits, the API nothing (infinite headroom)."""
    sized = plan(quiet(BASE))
    assert (sized.shards, sized.ingest_processes, sized.api_processes) == (1, 1, 1)
    assert sized.redis_cores == pytest.approx(
        BASE.workers * MEASURED.redis_us_per_stream_second / 1e6
    )
    assert sized.ingest_cores == pytest.approx(
        BASE.workers * MEASURED.ingest_us_per_stream_second / 1e6
    )
    assert sized.sidecar_cores == pytest.approx(MEASURED.ingest_us_per_stream_second / 1e6)
    idle = {b.name for b in sized.bottlenecks if math.isinf(b.headroom)}
    assert idle == {"API CPU per process"}
    assert "API CPU per process" in render(sized)


@pytest.mark.parametrize(
    ("entries", "event_rate", "fits"),
    [(1_000_000, 10_000, True), (1_000_000_000, 10_000, False), (1_000_000, 10_000_000, False)],
)
def test_the_memory_store_fits_one_process_by_memory_and_cpu(
    entries: int, event_rate: float, fits: bool
) -> None:
    fleet = dataclasses.replace(BASE, entries=entries, event_rate=event_rate, query_rate=10)
    assert plan(fleet).memory_store_fits is fits


def test_what_the_user_leaves_out_takes_the_worked_example_shape() -> None:
    fleet = describe(1_000, 100_000_000)
    assert fleet == Fleet(1_000, 100_000_000, 1_000_000, 100_000, 1_000_000.0, 10_000.0)
    assert describe(10, 5, sessions=3, query_rate=0).query_rate == 0


def test_smaller_batches_cost_more_per_block_event() -> None:
    big, small = plan(BASE), plan(dataclasses.replace(BASE, batch_events=BASE.batch_events / 4))
    for name in ("redis_cores", "ingest_cores", "memory_store_cores"):
        assert getattr(small, name) > getattr(big, name), name


def test_re_announced_block_events_cost_less_than_changing_ones() -> None:
    changing = plan(dataclasses.replace(BASE, reannounced=0.0))
    reannounced = plan(dataclasses.replace(BASE, reannounced=1.0))
    for name in ("redis_cores", "ingest_cores"):
        assert getattr(reannounced, name) < getattr(changing, name), name


def test_a_block_event_costs_its_share_of_the_call_and_its_kind() -> None:
    measured = dataclasses.replace(
        MEASURED,
        redis_us_per_call=100.0,
        redis_us_per_changing_event=4.0,
        redis_us_per_reannounced_event=1.0,
        ingest_us_per_call=200.0,
        ingest_us_per_changing_event=6.0,
        ingest_us_per_reannounced_event=2.0,
        receive_us_per_batch=50.0,
    )
    fleet = dataclasses.replace(BASE, batch_events=50.0, reannounced=0.25)
    assert measured.redis_us_per_block_event(fleet) == pytest.approx(2.0 + 3.0 + 0.25)
    assert measured.ingest_us_per_block_event(fleet) == pytest.approx(5.0 + 4.5 + 0.5)


@pytest.mark.e2e
def test_the_batch_flags_reach_the_plan() -> None:
    argv = ["size", "--workers", "1000", "--entries", "100000000", "--sessions", "1000000"]
    rates = ["--event-rate", "1000000", "--query-rate", "10000"]
    batches = ["--batch-events", "100", "--reannounced", "0.9"]
    result = subprocess.run(
        [sys.executable, "-m", "kvsi", *argv, *rates, *batches],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    fleet = describe(1_000, 100_000_000, 1_000_000, None, 1e6, 1e4, 100.0, 0.9)
    assert "batches: 100.0 block-events each, 90% of them re-announced" in result.stdout
    assert "a Redis Cluster of 9 masters" in result.stdout  # deploy/SIZING.md's figure
    assert result.stdout == render(plan(fleet)) + "\n"
    assert plan(fleet).redis_cores < plan(describe(1_000, 100_000_000, 1_000_000)).redis_cores


def test_no_re_announcement_is_kept_as_given() -> None:
    assert describe(10, 1_000, reannounced=0.0, batch_events=1.0).reannounced == 0.0


def test_the_feed_length_is_the_redis_store_default() -> None:
    assert mirror.FEED_LENGTH == FEED_LENGTH


def worked_examples() -> list[tuple[list[str], str]]:
    """Each `kvsi size` command deploy/SIZING.md shows (a bash block) and its output (the
    text block after it)."""
    found = re.findall(
        r"```bash\n\$ (kvsi size [^\n]+)\n```\n+```text\n(.*?)```", SIZING_DOC.read_text(), re.S
    )
    assert len(found) >= 2, "deploy/SIZING.md lacks its worked example or the 1/100 one"
    return [(shlex.split(command)[1:], shown) for command, shown in found]


@pytest.mark.e2e
@pytest.mark.parametrize("example", [0, 1], ids=["worked", "at-1/100"])
def test_the_docs_examples_are_what_kvsi_size_prints(example: int) -> None:
    argv, shown = worked_examples()[example]
    result = subprocess.run(
        [sys.executable, "-m", "kvsi", *argv], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == shown


def test_the_worked_example_is_the_model_of_its_flags() -> None:
    argv, shown = worked_examples()[0]
    value = dict(zip(argv[1::2], argv[2::2], strict=True))
    fleet = describe(
        int(value["--workers"]),
        int(value["--entries"]),
        int(value["--sessions"]),
        None,
        float(value["--event-rate"]),
        float(value["--query-rate"]),
    )
    assert fleet.workers == 1_000 and fleet.entries == 100_000_000 and fleet.sessions == 1_000_000
    assert render(plan(fleet)) + "\n" == shown


def test_a_plan_names_every_bottleneck_once() -> None:
    sized: Plan = plan(BASE)
    names = [b.name for b in sized.bottlenecks]
    assert len(names) == len(set(names)) == 6
    shown = render(sized)
    assert all(name in shown for name in names)


@pytest.mark.parametrize(
    ("workers", "reads"), [(100, 413 + 470), (1_000, 413 + 1_420), (10_000, 413 + 470 + 10_450)]
)
def test_a_routes_reads_follow_the_measured_line_through_the_fleet(
    workers: int, reads: float
) -> None:
    measured = dataclasses.replace(
        MEASURED,
        client_us_per_session_lookup=413.0,
        client_us_per_prefix_match=((100, 470.0), (1_000, 1_420.0)),
    )
    assert measured.client_us_per_route(workers) == pytest.approx(reads)


def test_a_measured_constant_is_read_from_one_place() -> None:
    busy = dataclasses.replace(BASE, query_rate=0)
    doubled = dataclasses.replace(
        MEASURED,
        redis_us_per_call=2 * MEASURED.redis_us_per_call,
        redis_us_per_changing_event=2 * MEASURED.redis_us_per_changing_event,
        redis_us_per_reannounced_event=2 * MEASURED.redis_us_per_reannounced_event,
    )
    streams = BASE.workers * MEASURED.redis_us_per_stream_second / 1e6
    assert plan(busy, measured=doubled, shards=3).redis_cores - streams == pytest.approx(
        2 * (plan(busy, shards=3).redis_cores - streams)
    )
    bigger = dataclasses.replace(MEASURED, redis_bytes_per_entry=MEASURED.redis_bytes_per_entry + 1)
    assert plan(busy, measured=bigger).redis_bytes == pytest.approx(
        plan(busy).redis_bytes + BASE.entries
    )


CURVE = ((10.0, 2.0), (40.0, 2.5), (160.0, 1.5), (640.0, 1.0))


@pytest.mark.parametrize(
    ("rate", "factor"),
    [
        (0.0, 2.5),  # below the least busy point: its factor (made no lower than a busier one's)
        (10.0, 2.5),
        (20.0, 2.5),  # the measured 2.0 at 10/s is below 2.5 at 40/s: a lighter load costs no less
        (40.0, 2.5),
        (80.0, 2.0),  # halfway on log(rate) from 40 to 160
        (160.0, 1.5),
        (320.0, 1.25),
        (640.0, 1.0),
        (10_000.0, 1.0),  # busier than back to back: the back-to-back cost
    ],
)
def test_an_apply_costs_more_the_more_its_unit_rests(rate: float, factor: float) -> None:
    assert light_load(CURVE, rate) == pytest.approx(factor)


def test_the_measured_curves_fall_to_one_at_their_busiest_point() -> None:
    for curve in (MEASURED.redis_light_load, MEASURED.ingest_light_load):
        rates = [rate for rate, _ in curve]
        assert rates == sorted(rates) and curve[-1][1] == 1.0
        assert all(factor >= 1.0 for _, factor in curve)


def test_shards_that_rest_spend_more_on_the_same_applies() -> None:
    """The same fleet on more shards: each rests longer between applies, so Redis spends
    more in all (the reads are the same); a sidecar, following one worker, spends more per
    block-event than a central process following many."""
    light = dataclasses.replace(BASE, query_rate=0)
    few, many = plan(light, shards=3), plan(light, shards=300)
    assert many.redis_cores > few.redis_cores
    calls = light.event_rate / light.batch_events
    applies = light.event_rate * MEASURED.redis_us_per_block_event(light)
    streams = light.workers * MEASURED.redis_us_per_stream_second
    rest = light_load(MEASURED.redis_light_load, calls / 300)
    assert many.redis_cores == pytest.approx((applies * rest + streams) / 1e6)
    assert few.sidecar_cores * light.workers > few.ingest_cores


def test_the_fewest_units_carry_the_load_they_make_at_that_count() -> None:
    """More units rest more: a load that fits two at its one-unit figure needs three."""
    assert fewest(lambda n: 0.9 + 0.1 * n, 0.5) == 3
    assert fewest(lambda n: 0.9, 0.5) == 2
    assert fewest(lambda n: 0.0, 0.5) == 1
