"""Simulated vLLM pods: engines with prefix caching that publish 0.33's KV-event frames.

Imports nothing from store/, api/ or kvsi/ (only subscriber.wire, the shared wire types).
"""

from kvsi.simulator.engine import SimulatedEngine
from kvsi.simulator.fleet import FleetStats, SimulatedFleet, WorkerEndpoints, pod_names, simulate
from kvsi.simulator.publisher import SimulatedPublisher
from kvsi.simulator.workload import AgenticWorkload, Request

__all__ = [
    "AgenticWorkload",
    "FleetStats",
    "Request",
    "SimulatedEngine",
    "SimulatedFleet",
    "SimulatedPublisher",
    "WorkerEndpoints",
    "pod_names",
    "simulate",
]
