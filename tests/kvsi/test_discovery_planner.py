"""Central mode's decision logic, pure: pod events and the clock in, streams and forgets out."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvsi.cli import app
from kvsi.discovery import (
    Assignment,
    Changes,
    FleetPlanner,
    PodEvent,
    PodInfo,
    PodSnapshot,
    publishers_of,
)
from kvsi.errors import StartupError
from kvsi.ownership import owner
from kvsi.settings import DiscoveryConfig, load_settings
from kvsi.store.model import WorkerKey
from kvsi.subscriber.stream import PublisherSpec
from tests.kvsi.paths import RECORDED_WATCH

CONFIG = DiscoveryConfig(labels={"app.kubernetes.io/name": "vllm"}, grace_seconds=30.0)


def running(name: str, ip: str = "10.0.0.5", **annotations: str) -> PodInfo:
    keyed = {f"kv-session-index/{k.replace('_', '-')}": v for k, v in annotations.items()}
    return PodInfo(name=name, ip=ip, running=True, annotations=keyed)


def started(changes: Changes) -> list[tuple[str, int, str, str | None]]:
    return [(s.pod, s.dp_rank, s.endpoint, s.replay_endpoint) for s in changes.start]


def test_a_running_pod_publishes_one_worker_per_rank_on_offset_ports() -> None:
    specs = publishers_of(running("vllm-a", dp_size="3", replay_port="5657"), CONFIG, "kv@")
    assert [(s.pod, s.dp_rank, s.endpoint, s.replay_endpoint, s.topic) for s in specs] == [
        ("vllm-a", 0, "tcp://10.0.0.5:5557", "tcp://10.0.0.5:5657", "kv@"),
        ("vllm-a", 1, "tcp://10.0.0.5:5558", "tcp://10.0.0.5:5658", "kv@"),
        ("vllm-a", 2, "tcp://10.0.0.5:5559", "tcp://10.0.0.5:5659", "kv@"),
    ]


def test_annotations_can_turn_replay_off_and_ipv6_is_bracketed() -> None:
    (spec,) = publishers_of(running("v", ip="fd00::7", replay_port="none"), CONFIG, "")
    assert spec.endpoint == "tcp://[fd00::7]:5557" and spec.replay_endpoint is None


@pytest.mark.parametrize(
    "pod",
    [
        PodInfo("pending", ip=None, running=False),
        PodInfo("no-ip-yet", ip=None, running=True),
        PodInfo("failed", ip="10.0.0.9", running=False),
    ],
)
def test_a_pod_that_is_not_running_with_an_ip_publishes_nothing(pod: PodInfo) -> None:
    assert publishers_of(pod, CONFIG, "") == ()


def test_a_bad_annotation_is_rejected_and_the_planner_skips_the_pod() -> None:
    with pytest.raises(ValueError):
        publishers_of(running("v", events_port="70000"), CONFIG, "")
    planner = FleetPlanner(CONFIG)
    assert planner.observe(PodEvent("ADDED", running("v", dp_size="lots")), 0.0) == Changes()
    assert planner.running == {}


def test_pod_added_starts_deleted_stops_at_once_and_forgets_after_grace() -> None:
    planner = FleetPlanner(CONFIG)
    changes = planner.observe(PodEvent("ADDED", running("vllm-a")), now=0.0)
    assert started(changes) == [("vllm-a", 0, "tcp://10.0.0.5:5557", "tcp://10.0.0.5:5657")]
    assert planner.observe(PodEvent("MODIFIED", running("vllm-a")), now=1.0) == Changes()

    gone = planner.observe(PodEvent("DELETED", running("vllm-a")), now=10.0)
    assert gone == Changes(stop=(WorkerKey("vllm-a", 0),))
    assert planner.wait_seconds(10.0) == 30.0
    assert planner.expire(39.9) == Changes()
    assert planner.expire(40.0) == Changes(forget=(WorkerKey("vllm-a", 0),))
    assert planner.wait_seconds(40.0) is None
    assert planner.expire(100.0) == Changes(), "forgotten once"


def test_a_pod_back_within_grace_is_not_forgotten() -> None:
    planner = FleetPlanner(CONFIG)
    planner.observe(PodEvent("ADDED", running("vllm-0")), now=0.0)
    planner.observe(PodEvent("MODIFIED", PodInfo("vllm-0", "10.0.0.5", running=False)), now=5.0)
    back = planner.observe(PodEvent("MODIFIED", running("vllm-0", ip="10.0.0.6")), now=20.0)
    assert started(back) == [("vllm-0", 0, "tcp://10.0.0.6:5557", "tcp://10.0.0.6:5657")]
    assert planner.expire(1000.0) == Changes()


def test_a_new_ip_under_the_same_name_restarts_the_stream_without_forgetting() -> None:
    planner = FleetPlanner(CONFIG)
    planner.observe(PodEvent("ADDED", running("vllm-0", ip="10.0.0.5")), now=0.0)
    moved = planner.observe(PodEvent("MODIFIED", running("vllm-0", ip="10.0.0.8")), now=1.0)
    assert moved.stop == (WorkerKey("vllm-0", 0),)
    assert started(moved) == [("vllm-0", 0, "tcp://10.0.0.8:5557", "tcp://10.0.0.8:5657")]
    assert planner.gone == {}


def test_fewer_ranks_stop_and_later_forget_only_the_dropped_ones() -> None:
    planner = FleetPlanner(CONFIG)
    planner.observe(PodEvent("ADDED", running("v", dp_size="2")), now=0.0)
    shrunk = planner.observe(PodEvent("MODIFIED", running("v", dp_size="1")), now=1.0)
    assert shrunk == Changes(stop=(WorkerKey("v", 1),))
    assert planner.expire(31.0) == Changes(forget=(WorkerKey("v", 1),))


def test_a_snapshot_stops_pods_it_no_longer_lists_and_starts_new_ones() -> None:
    planner = FleetPlanner(CONFIG)
    planner.observe(PodSnapshot((running("a"), running("b", ip="10.0.0.6"))), now=0.0)
    later = planner.observe(PodSnapshot((running("b", ip="10.0.0.6"), running("c"))), now=5.0)
    assert later.stop == (WorkerKey("a", 0),)
    assert [s.pod for s in later.start] == ["c"]
    assert set(planner.running) == {"b", "c"}


def test_a_recorded_watch_stream_gives_the_expected_worker_changes() -> None:
    """A Deployment's pod going Pending -> Running -> terminating -> Succeeded -> deleted,
    and a second pod with two DP ranks and its replay port annotated."""
    planner = FleetPlanner(CONFIG)
    seen: list[Changes] = []
    for t, line in enumerate(RECORDED_WATCH.read_text().splitlines()):
        event = json.loads(line)
        obj = event["object"]
        info = PodInfo(
            name=obj["metadata"]["name"],
            ip=obj["status"].get("podIP"),
            running=obj["status"]["phase"] == "Running",
            annotations=obj["metadata"].get("annotations", {}),
        )
        seen.append(planner.observe(PodEvent(event["type"], info), now=float(t)))
    a, b = "vllm-7d9c-abcde", "vllm-7d9c-fghij"
    assert seen == [
        Changes(),
        Changes(start=(PublisherSpec(a, "tcp://10.244.1.17:5557", "tcp://10.244.1.17:5657"),)),
        Changes(
            start=(
                PublisherSpec(b, "tcp://10.244.2.9:5557", "tcp://10.244.2.9:5657", 0),
                PublisherSpec(b, "tcp://10.244.2.9:5558", "tcp://10.244.2.9:5658", 1),
            )
        ),
        Changes(),  # terminating, still serving: keep streaming until it stops running
        Changes(stop=(WorkerKey(a, 0),)),
        Changes(),
    ]
    assert planner.expire(4.0 + 30.0) == Changes(forget=(WorkerKey(a, 0),))


def test_discovery_settings_need_ingest_and_labels_flags_need_a_value() -> None:
    with pytest.raises(StartupError, match="needs ingest"):
        load_settings(None, discovery={"labels": {"app": "vllm"}}, ingest=False)
    with pytest.raises(StartupError, match="labels"):
        load_settings(None, discovery={"labels": {}})
    result = CliRunner().invoke(app, ["serve", "--discover", "app"])
    assert result.exit_code != 0 and "expected KEY=VALUE" in result.output


# -- Assignment: the planner's changes, kept to the pods this replica owns ----------------


def replica_of(pod: str, replicas: tuple[str, ...]) -> str:
    found = owner(pod, replicas)
    assert found is not None
    return found


def test_without_splitting_a_replica_follows_every_pod() -> None:
    planner, mine = FleetPlanner(CONFIG), Assignment("only", split=False)
    changes = mine.on_fleet(planner.observe(PodSnapshot((running("a"), running("b"))), 0.0))
    assert [s.pod for s in changes.start] == ["a", "b"]
    assert mine.owned_pods() == 2


def test_a_splitting_replica_follows_nothing_before_its_first_beat() -> None:
    planner, mine = FleetPlanner(CONFIG), Assignment("r1", split=True)
    assert mine.on_fleet(planner.observe(PodSnapshot((running("a"),)), 0.0)) == Changes()
    started_now = mine.on_view(("r1",), planner.running)
    assert [s.pod for s in started_now.start] == ["a"]


def test_replicas_with_one_view_start_disjoint_pods_covering_the_fleet() -> None:
    view = ("r1", "r2", "r3")
    pods = tuple(running(f"vllm-{i}", dp_size="2") for i in range(12))
    followed: list[WorkerKey] = []
    for me in view:
        planner, mine = FleetPlanner(CONFIG), Assignment(me, split=True)
        mine.on_view(view, planner.running)
        changes = mine.on_fleet(planner.observe(PodSnapshot(pods), 0.0))
        assert {s.pod for s in changes.start} == {
            p.name for p in pods if replica_of(p.name, view) == me
        }
        followed += [WorkerKey(s.pod, s.dp_rank) for s in changes.start]
    assert sorted(followed) == sorted(WorkerKey(f"vllm-{i}", r) for i in range(12) for r in (0, 1))


def test_a_lost_replica_s_pods_are_started_by_their_new_owner_and_nothing_else_moves() -> None:
    pods = PodSnapshot(tuple(running(f"vllm-{i}") for i in range(20)))
    lost_pods = {p.name for p in pods.pods if replica_of(p.name, ("r1", "r2", "r3")) == "r3"}
    assert lost_pods, "the table needs pods on the lost replica"
    for me in ("r1", "r2"):
        planner, mine = FleetPlanner(CONFIG), Assignment(me, split=True)
        mine.on_view(("r1", "r2", "r3"), planner.running)
        mine.on_fleet(planner.observe(pods, 0.0))
        takeover = mine.on_view(("r1", "r2"), planner.running)
        assert takeover.release == () and takeover.stop == ()
        assert {s.pod for s in takeover.start} == {
            p for p in lost_pods if replica_of(p, ("r1", "r2")) == me
        }


def test_a_joining_replica_makes_the_others_release_only_what_it_takes() -> None:
    pods = PodSnapshot(tuple(running(f"vllm-{i}") for i in range(20)))
    planner, mine = FleetPlanner(CONFIG), Assignment("r1", split=True)
    mine.on_view(("r1", "r2"), planner.running)
    mine.on_fleet(planner.observe(pods, 0.0))
    before = {k.pod for k in mine.following}
    handed = mine.on_view(("r1", "r2", "r3"), planner.running)
    assert handed.start == () and handed.stop == () and handed.forget == ()
    assert {k.pod for k in handed.release} == {
        p for p in before if replica_of(p, ("r1", "r2", "r3")) == "r3"
    }
    assert handed.release, "the table needs pods that move"
    assert mine.on_view(("r1", "r2", "r3"), planner.running) == Changes(), "no change, nothing"


def test_only_the_owner_stops_marks_and_forgets_a_gone_pod() -> None:
    view = ("r1", "r2")
    name = "vllm-x"
    keeper = replica_of(name, view)
    for me in view:
        planner, mine = FleetPlanner(CONFIG), Assignment(me, split=True)
        mine.on_view(view, planner.running)
        mine.on_fleet(planner.observe(PodEvent("ADDED", running(name)), 0.0))
        gone = mine.on_fleet(planner.observe(PodEvent("DELETED", running(name)), 1.0))
        forgotten = mine.on_fleet(planner.expire(100.0))
        owns = me == keeper
        assert gone == (Changes(stop=(WorkerKey(name, 0),)) if owns else Changes())
        assert forgotten == (Changes(forget=(WorkerKey(name, 0),)) if owns else Changes())


def test_a_new_endpoint_of_an_owned_pod_restarts_its_stream() -> None:
    planner, mine = FleetPlanner(CONFIG), Assignment("r1", split=True)
    mine.on_view(("r1",), planner.running)
    mine.on_fleet(planner.observe(PodEvent("ADDED", running("v", ip="10.0.0.5")), 0.0))
    moved = mine.on_fleet(planner.observe(PodEvent("MODIFIED", running("v", ip="10.0.0.8")), 1.0))
    assert moved.stop == (WorkerKey("v", 0),)
    assert started(moved) == [("v", 0, "tcp://10.0.0.8:5557", "tcp://10.0.0.8:5657")]
    assert mine.following[WorkerKey("v", 0)].endpoint == "tcp://10.0.0.8:5557"


def test_split_needs_a_shared_store_and_a_ttl_of_two_beats() -> None:
    with pytest.raises(StartupError, match=r"discovery\.split needs a shared store"):
        load_settings(None, discovery={"labels": {"app": "vllm"}, "split": True})
    with pytest.raises(StartupError, match="twice beat_seconds"):
        load_settings(
            None,
            store="redis://127.0.0.1:1",
            discovery={"labels": {"a": "b"}, "beat_seconds": 3, "replica_ttl_seconds": 5},
        )
    split = load_settings(
        None, store="redis://127.0.0.1:1", discovery={"labels": {"a": "b"}, "split": True}
    )
    assert split.discovery is not None and split.discovery.replica_id
