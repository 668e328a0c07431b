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
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


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
    """uvicorn's httptools protocol writing through `OneSend`."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Not checked with isinstance: uvloop's transports have the methods, not the class.
        super().connection_made(OneSend(cast(asyncio.Transport, transport)))
