"""ZMQ sockets sized for a fleet: the context's socket limit, the process's file limit, the
room for streams they leave, and the failure a stream meets when a limit is reached anyway;
and `waiting_message`, how the receiver and the replay client read a socket without blocking.

Imports zmq only; never the store or the API. The simulator sizes its publishers' context
with the same `sized_context`.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import resource
from dataclasses import dataclass
from typing import cast

import zmq
import zmq.asyncio

SOCKETS_PER_STREAM = 3
"""A stream's SUB and its connection monitor's two PAIR ends (libzmq's inside the context,
and ours); libzmq's default context holds 1,023 sockets in all."""
FILES_PER_STREAM = 4
"""Descriptors per stream: each of its sockets' mailboxes (an eventfd) and its TCP
connection."""
FILES_PER_REPLAY = 2
"""Descriptors per replay in flight: the DEALER's mailbox and its TCP connection."""
FILES_KEPT = 256
"""Descriptors no stream may take: HTTP clients, the index store's connections, the
interpreter's own files. Streams that found none left would also starve `/readyz`."""
SOCKETS_KEPT = 16
"""Context slots kept beyond the counted ones (a command-line `kvsi tail`, a test's probe)."""


_NOBLOCK = int(zmq.NOBLOCK)
"""A plain int: pyzmq's flag enum would be combined and converted again on every read."""
_POLLIN = int(zmq.POLLIN)
_EVENTS = int(zmq.EVENTS)
_get = zmq.Socket.get
_recv = zmq.Socket.recv
"""pyzmq's socket methods (its C ones: the Python class adds none of these), called
unbound: the class defines `__getattr__` (socket options as attributes), which sends every
attribute lookup on an instance down CPython's slow path."""


def waiting_message(sock: zmq.Socket[bytes]) -> list[bytes] | None:
    """The frames of the next message waiting on `sock`, None if none is: never blocks.

    Asking ZMQ_EVENTS first processes the socket's pending commands (which re-arms its
    ZMQ_FD, as a read ending in EAGAIN does) without the exception such a read raises; the
    frames are read with the more-flag pyzmq reads in C (no Python-level RCVMORE query, with
    its option-enum conversion, each) and copied to bytes.
    """
    if not cast(int, _get(sock, _EVENTS)) & _POLLIN:
        return None
    frame = _recv(sock, _NOBLOCK, copy=False)
    frames = [frame.bytes]
    while frame.more:
        frame = _recv(sock, _NOBLOCK, copy=False)
        frames.append(frame.bytes)
    return frames


class ResourceReason(enum.StrEnum):
    """Why a stream could not open a socket; stable labels of
    `kvsi_resource_failures_total`."""

    NO_ROOM = "no_room"
    """The process's own budget of streams is full (see `StreamRoom`)."""
    TOO_MANY_OPEN_FILES = "too_many_open_files"
    """EMFILE: the context's socket limit or the process's file limit."""
    SYSTEM_FILE_TABLE_FULL = "system_file_table_full"
    """ENFILE: the host ran out of file descriptors."""
    OUT_OF_MEMORY = "out_of_memory"
    """ENOMEM or ENOBUFS."""
    BAD_ENDPOINT = "bad_endpoint"
    """EINVAL: libzmq refuses the endpoint itself; no resource would help (the settings and
    the Dynamo API check endpoints first, so this is what slips past them)."""
    SOCKET_ERROR = "socket_error"
    """Any other error of socket creation or connect (the message says which)."""


_REASONS = {
    errno.EMFILE: ResourceReason.TOO_MANY_OPEN_FILES,
    errno.ENFILE: ResourceReason.SYSTEM_FILE_TABLE_FULL,
    errno.ENOMEM: ResourceReason.OUT_OF_MEMORY,
    errno.ENOBUFS: ResourceReason.OUT_OF_MEMORY,
    errno.EINVAL: ResourceReason.BAD_ENDPOINT,
}


class ResourceError(Exception):
    """A stream could not open (or connect) a socket; `reason` is a stable label."""

    def __init__(self, reason: ResourceReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def socket_failure(exc: zmq.ZMQError, what: str) -> ResourceError:
    """The ResourceError for a failed socket call; ETERM (the context is closing) is not one
    and is raised again."""
    if exc.errno == zmq.ETERM:
        raise exc
    reason = _REASONS.get(exc.errno or 0, ResourceReason.SOCKET_ERROR)
    return ResourceError(reason, f"cannot open {what}: {exc}")


def open_live(
    ctx: zmq.asyncio.Context, topic: str, endpoint: str, room: StreamRoom | None = None
) -> tuple[zmq.asyncio.Socket, zmq.asyncio.Socket]:
    """A SUB subscribed to `topic` and connecting to `endpoint`, and the monitor of its
    connects and disconnects (set up first: no event is missed), holding a place in `room`
    (None: not counted); ResourceError if there is none or a socket cannot be opened, with
    whatever was opened closed and the place given back."""
    if room is not None:
        room.take()
    sock: zmq.asyncio.Socket | None = None
    try:
        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
        monitor = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        try:
            sock.connect(endpoint)
        except zmq.ZMQError:
            monitor.close(linger=0)
            raise
    except zmq.ZMQError as exc:
        if sock is not None:
            with contextlib.suppress(zmq.ZMQError):
                sock.disable_monitor()  # libzmq's end, if only ours failed to open
            sock.close(linger=0)
        if room is not None:
            room.give_back()
        raise socket_failure(exc, f"the live stream's ZMQ sockets for {endpoint}") from exc
    return sock, monitor


@dataclass(frozen=True)
class Limits:
    """What a sized context and the process's file limit allow."""

    sockets: int
    """The context's socket limit (ZMQ_MAX_SOCKETS)."""
    files: int
    """The process's soft file limit (RLIMIT_NOFILE) now."""
    files_hard: int
    """Its hard limit: the most an unprivileged process can raise the soft one to."""


def sized_context(sockets: int, files: int) -> tuple[zmq.asyncio.Context, Limits]:
    """A new asyncio context that holds `sockets` sockets (libzmq's default is 1,023), with
    the process's soft file limit raised toward `files` (up to the hard limit; never lowered).

    The socket limit is set before the context's first socket: libzmq reads it only then.
    """
    ctx = zmq.asyncio.Context()
    wanted = min(max(sockets + SOCKETS_KEPT, ctx.get(zmq.MAX_SOCKETS)), ctx.get(zmq.SOCKET_LIMIT))
    ctx.set(zmq.MAX_SOCKETS, wanted)
    soft, hard = raise_file_limit(files)
    return ctx, Limits(sockets=ctx.get(zmq.MAX_SOCKETS), files=soft, files_hard=hard)


def raise_file_limit(files: int) -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to `files` if it is lower, up to the hard limit;
    returns (soft, hard) in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ceiling = files if hard == resource.RLIM_INFINITY else min(files, hard)
    if soft != resource.RLIM_INFINITY and soft < ceiling:
        resource.setrlimit(resource.RLIMIT_NOFILE, (ceiling, hard))
        soft = ceiling
    return soft, hard


def ingest_needs(workers: int, replays: int) -> tuple[int, int]:
    """(sockets, files) that `workers` streams and `replays` replays in flight need."""
    sockets = workers * SOCKETS_PER_STREAM + replays
    files = workers * FILES_PER_STREAM + replays * FILES_PER_REPLAY + FILES_KEPT
    return sockets, files


def room_for(workers: int, limits: Limits, replays: int) -> StreamRoom:
    """Room for `workers` streams, or fewer if `limits` hold fewer (the replays' sockets and
    the kept files aside); its message names the limit that binds."""
    by_sockets = (limits.sockets - SOCKETS_KEPT - replays) // SOCKETS_PER_STREAM
    by_files = (limits.files - FILES_KEPT - replays * FILES_PER_REPLAY) // FILES_PER_STREAM
    capacity = max(0, min(workers, by_sockets, by_files))
    if capacity == workers:
        why = f"this process is sized for {workers} workers; raise KVSI_MAX_WORKERS"
    elif by_files <= by_sockets:
        why = (
            f"the file limit ({limits.files}, hard {limits.files_hard}) leaves room for "
            f"{capacity} streams ({FILES_PER_STREAM} descriptors each, {FILES_KEPT} kept for "
            "HTTP and the store); raise the hard file limit (ulimit -n)"
        )
    else:
        why = (
            f"the ZMQ socket limit ({limits.sockets}) leaves room for {capacity} streams "
            f"({SOCKETS_PER_STREAM} sockets each)"
        )
    return StreamRoom(capacity, why)


class StreamRoom:
    """The streams this process has room for; a stream holds a place while its live
    sockets are open, and one without a place waits (its worker `degraded`, saying why).

    Counted here rather than left to the operating system: a process that ran out of
    descriptors could not answer `/readyz` either, and which streams failed would be chance.
    """

    def __init__(self, capacity: int, why: str) -> None:
        self.capacity = capacity
        self.why = why
        """Which limit bounds the room, and what raises it."""
        self.used = 0

    def take(self) -> None:
        """Take a place; ResourceError(NO_ROOM) when there is none."""
        if self.used >= self.capacity:
            raise ResourceError(ResourceReason.NO_ROOM, f"no room for this stream: {self.why}")
        self.used += 1

    def give_back(self) -> None:
        self.used -= 1
