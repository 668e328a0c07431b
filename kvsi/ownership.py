"""Which central replica follows which pod: rendezvous hashing over the live replicas.

Pure: no I/O, no clock, imports only hashlib. Every replica that holds the same view of the
live replicas computes the same owner for every pod, so identical views give disjoint
assignments that cover every pod; a replica leaving moves only its own pods (each to
exactly one survivor), a replica joining takes only the pods it now outweighs the others
on (about 1/N of them). Why rendezvous rather than a ring: no virtual nodes to tune, an even
split at any N, and the owner is one max over the members (N is a handful of replicas).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable


def weight(replica: str, pod: str) -> int:
    """The replica's weight for the pod: 64 bits of BLAKE2b over both names, the same in
    every process (Python's own `hash` is salted per process)."""
    digest = hashlib.blake2b(
        replica.encode() + b"\x00" + pod.encode(), digest_size=8, person=b"kvsi-own"
    ).digest()
    return int.from_bytes(digest, "big")


def owner(pod: str, replicas: Iterable[str]) -> str | None:
    """The replica with the highest weight for the pod (a tie goes to the greater name);
    None without replicas."""
    return max(replicas, key=lambda replica: (weight(replica, pod), replica), default=None)


def owned(pods: Iterable[str], replicas: Collection[str], me: str) -> set[str]:
    """The pods `me` follows given the live `replicas`: none when `me` is not among them
    (a replica whose own beat is not seen claims nothing new)."""
    if me not in replicas:
        return set()
    return {pod for pod in pods if owner(pod, replicas) == me}
