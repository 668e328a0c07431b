"""The receiver: a stream's SUB socket drained into its inbox, a burst per wake-up.

Imports zmq, asyncio and inbox.py; never the store. The receiver never waits on anything but
the socket (see inbox.py for why). It reads without a Future per message: the event loop
calls `drain` when the socket's ZMQ_FD turns readable, and `drain` reads every waiting
message without blocking, then hands them to the inbox as one burst.

ZMQ_FD signals a change, not a level: it does not turn readable again for messages that
were already waiting. So `drain` reads until ZMQ_EVENTS shows none waiting (asking it also
processes the socket's pending commands, re-arming the signal: `sockets.waiting_message`),
drains once at start (messages may have queued before the reader was added), and, when it
stops at DRAIN_MAX, calls itself again on the loop's next turn instead of waiting for a
signal that will not come.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import zmq
import zmq.asyncio

from kvsi.subscriber.inbox import Inbox
from kvsi.subscriber.sockets import waiting_message

DRAIN_MAX = 512
"""Most messages read in one wake-up: a publisher faster than the applier must not hold the
event loop (the applier, other streams, the API) for one unbounded read."""


class Receiver:
    """Reads one SUB socket into one inbox; the only reader of that socket.

    `on_topic(topic)`: called with a message's topic frame when it differs from the last
    one's (None: topics are not watched). `on_overflow()`: called after a burst the full
    inbox dropped messages of.
    """

    def __init__(
        self,
        sock: zmq.asyncio.Socket,
        inbox: Inbox,
        *,
        on_topic: Callable[[bytes], None] | None,
        on_overflow: Callable[[], None],
    ) -> None:
        # A plain socket on the same libzmq socket: its reads return at once, no Future.
        # The asyncio socket is never read, so it never registers a reader of its own.
        self._sock: zmq.Socket[bytes] = zmq.Socket.shadow(sock.underlying)
        self._inbox = inbox
        self._on_topic = on_topic
        self._on_overflow = on_overflow
        self._topic = b""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Future[None] | None = None

    async def run(self) -> None:
        """Read until cancelled; raises the socket's error if a read fails otherwise."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._stopped = loop.create_future()
        fd = self._sock.FD
        loop.add_reader(fd, self.drain)
        try:
            self.drain()
            await self._stopped
        finally:
            loop.remove_reader(fd)
            self._stopped = None

    def drain(self) -> None:
        """Read what the socket holds (up to DRAIN_MAX) into the inbox, as one burst."""
        stopped = self._stopped
        if stopped is None or stopped.done():
            return
        sock = self._sock
        burst: list[list[bytes]] = []
        try:
            while (frames := waiting_message(sock)) is not None:
                burst.append(frames)
                if len(burst) == DRAIN_MAX:
                    assert self._loop is not None
                    self._loop.call_soon(self.drain)
                    break
        except zmq.ZMQError as exc:
            stopped.set_exception(exc)
        if burst:
            self._deliver(burst)

    def _deliver(self, burst: list[list[bytes]]) -> None:
        on_topic = self._on_topic
        if on_topic is not None:
            for frames in burst:
                if frames[0] != self._topic:
                    self._topic = frames[0]
                    on_topic(frames[0])
        if self._inbox.put(burst, time.monotonic()):
            self._on_overflow()
