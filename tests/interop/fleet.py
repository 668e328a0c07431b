"""Pods of real vLLM workers on loopback ports, fed one agentic workload with sticky sessions.

Imports vLLM through tests.interop.engines and the simulator's workload (token ids only);
nothing from kvsi's subscriber, store or API.
"""

from __future__ import annotations

import random
from collections import deque
from types import TracebackType

from kvsi.simulator.workload import AgenticWorkload, Request
from tests.interop.engines import Turn, VllmWorker, kv_events_config
from tests.ports import free_port_run

WorkerKey = tuple[str, int]
"""(pod, DP rank)."""

MIGRATE_PROB = 0.1
"""Chance per turn that a session moves to another worker, as a rebalancing router does."""


def agents(seed: int) -> AgenticWorkload:
    """Ten concurrent agent sessions on two system prompts, contexts up to 48 blocks."""
    return AgenticWorkload(
        sessions=10, seed=seed, system_prompts=2, turns=(3, 8), max_context_tokens=768
    )


class VllmFleet:
    """Pods of `VllmWorker`s; `run` routes the workload's turns to them and steps them all.

    Pod p with d DP ranks takes 2d consecutive ports: PUB ports first (vLLM puts rank r at the
    pod's port + r), then ROUTER ports. A session sticks to the worker it started on but may
    move (MIGRATE_PROB), so sessions hold blocks on several workers. A session's next turn
    waits for its previous one to finish, as an agent waits for the reply (sent earlier, its
    prompt would hold tokens still being generated, and vLLM would cache their block twice).
    The last 1..8 tokens of each turn are generated (decoded one by one), the rest is the
    prompt.
    """

    def __init__(
        self,
        pods: dict[str, int],
        *,
        workload: AgenticWorkload,
        num_blocks: int,
    ) -> None:
        """`pods` maps each pod to its number of DP ranks."""
        self.workload = workload
        self._num_blocks = num_blocks
        self._rng = random.Random(0)  # apart from the workload's: routing never changes turns
        self._ports: dict[str, tuple[int, int]] = {}
        self.workers: dict[WorkerKey, VllmWorker] = {}
        for pod, dp_size in pods.items():
            base = free_port_run(2 * dp_size)
            self._ports[pod] = (base, base + dp_size)
            for rank in range(dp_size):
                self.workers[(pod, rank)] = self._worker(pod, rank)
        self._route: dict[str, WorkerKey] = {}
        self._held: dict[str, deque[Turn]] = {}
        self._busy: set[str] = set()
        self._assigned = 0
        self.turns = 0

    def __enter__(self) -> VllmFleet:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Shut every worker's publisher down."""
        for worker in self.workers.values():
            worker.close()

    def serve_args(self) -> list[str]:
        """`kvsi serve` flags naming every worker (`POD/RANK` past rank 0, as the README says)."""
        args: list[str] = []
        for (pod, rank), worker in self.workers.items():
            name = pod if rank == 0 else f"{pod}/{rank}"
            args += [
                "--pod",
                f"{name}={worker.endpoint}",
                "--replay",
                f"{name}={worker.replay_endpoint}",
            ]
        return args

    def run(self, turns: int) -> None:
        """Serve `turns` more turns of the workload, stepping every worker until all are done."""
        target = self.turns + turns
        while self.turns < target or self._held or self._busy:
            self._pull(min(target - self.turns, len(self.workers)))
            self._submit_ready()
            for worker in self.workers.values():
                self._busy.difference_update(worker.step())

    def wait_sent(self) -> None:
        """Until every worker's publisher thread has sent all it was given."""
        for worker in self.workers.values():
            worker.wait_sent()

    def reset_prefix_cache(self, pod: str) -> None:
        """vLLM's reset_prefix_cache on every worker of `pod` (between runs: all idle)."""
        for (name, _), worker in self.workers.items():
            if name == pod:
                worker.reset_prefix_cache()

    def restart(self, pod: str) -> None:
        """Every worker of `pod` replaced by a new engine on the same ports: empty, seq from 0."""
        for key, worker in list(self.workers.items()):
            if key[0] == pod:
                worker.close()
                self.workers[key] = self._worker(*key)

    def _worker(self, pod: str, rank: int) -> VllmWorker:
        pub, replay = self._ports[pod]
        return VllmWorker(
            pod, kv_events_config(pod, pub, replay), dp_rank=rank, num_blocks=self._num_blocks
        )

    def _pull(self, count: int) -> None:
        for _ in range(count):
            request = self.workload.next_request()
            if request is None:
                raise AssertionError("the workload ended before the turns asked for")
            self.turns += 1
            self._held.setdefault(request.session_id, deque()).append(self._turn(request))

    def _turn(self, request: Request) -> Turn:
        generated = self._rng.randint(1, 8)
        tokens = request.token_ids
        return Turn(request.session_id, tokens[:-generated], tokens[-generated:])

    def _submit_ready(self) -> None:
        for session_id in [s for s in self._held if s not in self._busy]:
            queue = self._held[session_id]
            turn = queue.popleft()
            if not queue:
                del self._held[session_id]
            self.workers[self._worker_for(session_id)].submit(turn)
            self._busy.add(session_id)

    def _worker_for(self, session_id: str) -> WorkerKey:
        keys = list(self.workers)
        key = self._route.get(session_id)
        if key is None:
            key = keys[self._assigned % len(keys)]
            self._assigned += 1
        elif len(keys) > 1 and self._rng.random() < MIGRATE_PROB:
            key = self._rng.choice([k for k in keys if k != key])
        self._route[session_id] = key
        return key
