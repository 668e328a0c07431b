"""Simulated vLLM pods: engines with prefix caching that publish 0.33's KV-event frames.

Imports nothing from store/, api/ or kvsi/ (only subscriber.wire, the shared wire types).
"""

from simulator.engine import SimulatedEngine
from simulator.fleet import FleetStats, SimulatedFleet, WorkerEndpoints, pod_names, simulate
from simulator.publisher import SimulatedPublisher
from simulator.workload import AgenticWorkload, Request

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
