"""uvicorn's httptools protocol, each response's writes of one loop turn sent as one.

Imports asyncio and uvicorn only. uvicorn writes a response's status line and headers, then
its body, each with a transport write; on a connection whose send buffer is empty (every
answer of a keep-alive client waiting for it) each write is a send(2) of its own and a TCP
segment of its own, and the reader wakes for each. `OneSend` holds the writes made while a
callback runs and sends them together right after it, in the same loop turn: one system
call and one segment per answer, however the app split it. Nothing waits for more data: a
stream's event still leaves in the turn that wrote it.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterable
from typing import Any, Protocol, cast

from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)


class OneSend(asyncio.Transport):
    """A transport that passes the writes made in one loop turn on to `transport` as one,
    in order, before anything else it is asked (closing, aborting) takes effect."""

    def __init__(self, transport: asyncio.Transport) -> None:
        super().__init__()
        self._transport = transport
        self._held: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._held:
            asyncio.get_running_loop().call_soon(self._flush)
        self._held.append(bytes(data))

    def _flush(self) -> None:
        if self._held:
            data = b"".join(self._held) if len(self._held) > 1 else self._held[0]
            self._held.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def write_now(self, data: bytes) -> None:
        """Write `data` after whatever is held, at once: for a caller that wrote a whole
        answer as one."""
        if self._held:
            self._held.append(data)
            self._flush()
        elif not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._held.clear()
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._held))

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)


class OneSendHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol writing through `OneSend`, with one keep-alive timer per
    connection: uvicorn cancels its timer whenever data arrives and makes a new one whenever
    a response completes with nothing pipelined behind it; here the pending timer stays.
    The connection is busy from a request's first byte (or any data) until a response
    completes, idle from then on; when the timer fires it closes an idle connection once
    `timeout_keep_alive` has passed since that response, is set again for then if less has,
    and does nothing on a busy one (the next response sets it again)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._idle_since: float | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Not checked with isinstance: uvloop's transports have the methods, not the class.
        super().connection_made(OneSend(cast(asyncio.Transport, transport)))

    def _unset_keepalive_if_required(self) -> None:
        self._idle_since = None

    def on_message_begin(self) -> None:
        # Busy even when no data arrived since the last response: a request read in the
        # same callback as one answered at once (DirectHttpTools) is not pipelined behind it.
        self._idle_since = None
        super().on_message_begin()

    def on_response_complete(self) -> None:
        if self.pipeline or self.transport.is_closing():
            super().on_response_complete()  # no keep-alive timer in either case
            return
        self.server_state.total_requests += 1
        self.flow.resume_reading()
        self._idle_since = self.loop.time()
        if self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_at(
                self._idle_since + self.timeout_keep_alive, self._keep_alive_due
            )

    def _keep_alive_due(self) -> None:
        self.timeout_keep_alive_task = None
        if self._idle_since is None:
            return  # busy: set again when its response completes
        due = self._idle_since + self.timeout_keep_alive
        if self.loop.time() < due:
            self.timeout_keep_alive_task = self.loop.call_at(due, self._keep_alive_due)
        else:
            self.timeout_keep_alive_handler()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timeout_keep_alive_task is not None:
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = None
        super().connection_lost(exc)


Reply = Callable[[int, list[tuple[bytes, bytes]], bytes], None]
"""A direct answer's response: status, headers (lowercase names), body."""


class DirectAnswers(Protocol):
    """Requests the app answers for the server itself, without an ASGI cycle (the API's
    `DirectServer`)."""

    eager: bool
    """Whether an answer's first step may run outside any task, in the callback that read
    the request: true where it never waits (the memory store's reads); false where it
    waits on something a task must own (a network store's reads, under `asyncio.timeout`)."""

    def takes(self, method: str, path: str, headers: Iterable[tuple[bytes, bytes]]) -> bool:
        """Whether the request may be answered directly, from its head alone."""
        ...

    def answer(self, scope: dict[str, Any], body: bytes, reply: Reply) -> Coroutine[Any, Any, bool]:
        """Reply and return True, or return False having replied nothing (the app's)."""
        ...


class DirectHttpTools(OneSendHttpTools):
    """`OneSendHttpTools` handing the requests `answers` takes to it instead of the app.

    uvicorn makes every request's scope and cycle as usual; a request `answers` takes (one
    not pipelined behind another, no `Expect: 100-continue`, a body of a declared length
    under uvicorn's read buffer) is held until its body is complete, then answered by
    running `answers.answer`, without ASGI messages: where `answers.eager`, at once in the
    callback that read the request's end, with no task and no loop turn for an answer that
    never waits (the memory store's), one that waits continuing in a task; otherwise in a
    task of its own from the start (a network store's). A declined request, or
    one whose answer raised before replying, goes to the app in uvicorn's own task: the
    same answer, errors included, as if it had never been held. Each answer runs in a
    context of its own (the request id it binds for its log lines ends with it).
    """

    answers: DirectAnswers | None = None
    """Set on a subclass (`serving_protocol`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._held: tuple[RequestResponseCycle, Any] | None = None
        self._unheld = False

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        if self._unheld or self.answers is None or not self._holds(cycle):
            super()._start_asgi_task(cycle, app)
            return
        self._held = (cycle, app)

    def _holds(self, cycle: RequestResponseCycle) -> bool:
        assert self.answers is not None
        scope = cycle.scope
        if cycle.waiting_for_100_continue or self.pipeline:
            return False
        for name, value in scope["headers"]:
            if name == b"transfer-encoding":
                return False
            if name == b"content-length" and not (
                value.isdigit() and int(value) <= HIGH_WATER_LIMIT
            ):
                return False
        return self.answers.takes(scope["method"], scope["path"], scope["headers"])

    def on_message_complete(self) -> None:
        super().on_message_complete()
        held, self._held = self._held, None
        if held is not None and not held[0].disconnected:
            context = contextvars.copy_context()
            context.run(self._answer, *held, context)

    def on_response_complete(self) -> None:
        # A pipelined request started from here goes to the app: held, it would be
        # answered within the answer before it.
        self._unheld = True
        try:
            super().on_response_complete()
        finally:
            self._unheld = False

    def connection_lost(self, exc: Exception | None) -> None:
        self._held = None
        super().connection_lost(exc)

    def _answer(self, cycle: RequestResponseCycle, app: Any, context: contextvars.Context) -> None:
        assert self.answers is not None
        reply = functools.partial(self._reply, cycle)
        # A copy: what the answer writes into its scope stays out of a declined request's.
        answer = self.answers.answer(dict(cycle.scope), bytes(cycle.body), reply)
        rest: Awaitable[bool] = answer
        if self.answers.eager:
            try:
                rest = _Resumed(answer, answer.send(None))
            except StopIteration as done:
                if not done.value:
                    self._decline(cycle, app)
                return
            except Exception as exc:  # the app answers it again, and words or logs the failure
                self._failed(cycle, app, exc)
                return
        task = self.loop.create_task(self._finish(cycle, app, rest), context=context)
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    async def _finish(self, cycle: RequestResponseCycle, app: Any, rest: Awaitable[bool]) -> None:
        try:
            answered = await rest
        except Exception as exc:  # as in _answer
            self._failed(cycle, app, exc)
            return
        if not answered:
            self._decline(cycle, app)

    def _decline(self, cycle: RequestResponseCycle, app: Any) -> None:
        """The app answers the request after all, in uvicorn's task, from the body held."""
        if not cycle.disconnected:
            super()._start_asgi_task(cycle, app)

    def _failed(self, cycle: RequestResponseCycle, app: Any, exc: Exception) -> None:
        """Before a reply, the app answers (and words or logs the failure); after one, as
        uvicorn does with an app that raises mid-response: logged, the connection closed."""
        if not cycle.response_started:
            self._decline(cycle, app)
            return
        self.logger.error("Exception in ASGI application\n", exc_info=exc)
        if not self.transport.is_closing():
            self.transport.close()

    def _reply(
        self,
        cycle: RequestResponseCycle,
        status: int,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
    ) -> None:
        """Write the response as uvicorn's cycle writes a complete one, and end the cycle."""
        if cycle.disconnected:
            return
        cycle.response_started = True
        content = [STATUS_LINE[status]]
        closing = False
        for name, value in (*cycle.default_headers, *headers):
            if name == b"connection" and b"close" in [t.strip() for t in value.lower().split(b",")]:
                closing = True
            content += (name, b": ", value, b"\r\n")
        keep_alive = cycle.keep_alive and not closing
        if not keep_alive and not closing:
            content.append(b"connection: close\r\n")
        content += (b"\r\n", body)
        if isinstance(self.transport, OneSend):  # one write already: no need to hold it
            self.transport.write_now(b"".join(content))
        else:
            self.transport.write(b"".join(content))
        cycle.keep_alive = keep_alive
        cycle.response_complete = True
        cycle.message_event.set()
        if not keep_alive:
            self.transport.close()
        cycle.on_response()


class _Resumed:
    """Awaitable: the rest of a coroutine whose first step has already run and yielded
    `waits_on`; awaited in a task, it waits as the coroutine asked and returns its result."""

    def __init__(self, coroutine: Coroutine[Any, Any, bool], waits_on: Any) -> None:
        self._coroutine = coroutine
        self._waits_on = waits_on

    def __await__(self) -> Generator[Any, Any, bool]:
        coroutine, waits_on = self._coroutine, self._waits_on
        while True:
            try:
                sent = yield waits_on
            except BaseException as exc:  # a cancellation: passed on to the coroutine
                try:
                    waits_on = coroutine.throw(exc)
                except StopIteration as done:
                    return bool(done.value)
            else:
                try:
                    waits_on = coroutine.send(sent)
                except StopIteration as done:
                    return bool(done.value)


def serving_protocol(answers: DirectAnswers | None) -> type[OneSendHttpTools]:
    """The protocol class for uvicorn's `http`: `DirectHttpTools` answering `answers`'s
    requests, or `OneSendHttpTools` without any."""
    if answers is None:
        return OneSendHttpTools

    class Serving(DirectHttpTools):
        pass

    Serving.answers = answers
    return Serving
