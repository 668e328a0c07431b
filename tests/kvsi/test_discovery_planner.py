"""Central mode's decision logic, pure: pod events and the clock in, streams and forgets out."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvsi.cli import app
from kvsi.discovery import Changes, FleetPlanner, PodEvent, PodInfo, PodSnapshot, publishers_of
from kvsi.errors import StartupError
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
