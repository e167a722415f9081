"""uvicorn's h11 protocol with read deadlines and half-close support (slow or odd clients).

uvicorn 0.5x has a keep-alive timeout but no header or body read timeout: a client that sends
its headers one byte every few seconds holds a connection (and a slot of the connection cap)
for ever, because every byte cancels the keep-alive timer. And when a client shuts down its
write side after a full request (`shutdown(SHUT_WR)`, `nc -N`), asyncio closes the transport
unless eof_received() returns True, so the request was cancelled instead of answered.

Deadlines, per request (from the moment the phase starts; not reset by each byte):
    head  request line + headers: from the connection (or the next request's first byte)
    body  the body, from the end of the headers
A head that misses its deadline gets 408 and the connection closes; a body that misses it
closes the connection (the app sees a disconnect). While the response is being generated no
read deadline applies (a generation may take minutes; request_timeout_s bounds it).
Beyond max_connections open connections, a new one gets 503 (JSON) at once and is closed.
"""
from __future__ import annotations

import asyncio
import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

_408 = json.dumps({"error": {"message": "the request headers did not arrive in time", "type":
                             "invalid_request_error", "param": None, "code": "request_timeout"}}).encode()


_503 = json.dumps({"error": {"message": "too many open connections; retry shortly", "type": "server_error",
                             "param": None, "code": "too_many_connections"}}).encode()


class GuardedH11Protocol(H11Protocol):
    head_s = 10.0
    body_s = 60.0
    max_connections = 256

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._phase: str | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._eof = False
        self._refused = False
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:  # the cap: answer at once, drop what it sends
            self._refused = True
            transport.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 2"
                            b"\r\nconnection: close\r\ncontent-length: " + str(len(_503)).encode() + b"\r\n\r\n" + _503)
            transport.write_eof()
            # closing with unread request bytes would reset the connection before the 503 is read
            self._deadline = self.loop.call_later(1.0, transport.close)
            return
        self._watch()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        super().data_received(data)
        self._watch()

    def _watch(self) -> None:
        """(Re)arm the deadline when the client-side phase changes (h11's their_state)."""
        st = self.conn.their_state
        phase = "head" if st is h11.IDLE else "body" if st is h11.SEND_BODY else None
        if phase == self._phase:
            return
        self._phase = phase
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if phase is not None and not self.transport.is_closing():
            self._deadline = self.loop.call_later(self.head_s if phase == "head" else self.body_s, self._too_slow,
                                                  phase)

    def _too_slow(self, phase: str) -> None:
        self._deadline = None
        if self.transport.is_closing() or self._phase != phase:
            return
        if phase == "head" and (self.cycle is None or self.cycle.response_complete):  # no response under way
            self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                                 b"connection: close\r\ncontent-length: " + str(len(_408)).encode() + b"\r\n\r\n" + _408)
        self.transport.close()

    def on_response_complete(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        # the next request's head deadline starts with its first byte (data_received); until then
        # uvicorn's keep-alive timeout bounds the idle connection
        self._phase = None
        super().on_response_complete()
        if self._eof and not self.transport.is_closing():
            self.transport.close()  # the client cannot send another request: done

    def send_400_response(self, msg: str) -> None:
        """A malformed request line or headers: the OpenAI error body (uvicorn sends plain text)."""
        body = json.dumps({"error": {"message": f"malformed HTTP request: {msg}", "type": "invalid_request_error",
                                     "param": None, "code": "invalid_http"}}).encode()
        try:
            self.transport.write(self.conn.send(h11.Response(status_code=400, reason=b"Bad Request", headers=[
                (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                (b"connection", b"close")])))
            self.transport.write(self.conn.send(h11.Data(data=body)))
            self.transport.write(self.conn.send(h11.EndOfMessage()))
        except h11.LocalProtocolError:
            pass
        self.transport.close()

    def eof_received(self) -> bool | None:
        """Client shut its write side. Keep the transport open to answer a request already
        received in full; close otherwise (a partial request can never complete)."""
        self._eof = True
        if self._refused:
            return None
        if self.cycle is not None and not self.cycle.response_complete and \
                self.conn.their_state in (h11.DONE, h11.MUST_CLOSE):
            return True
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        super().connection_lost(exc)


def guarded_protocol(head_s: float, body_s: float, max_connections: int) -> type[GuardedH11Protocol]:
    """A protocol class with these limits (uvicorn.Config(http=...) takes a class)."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,),
                {"head_s": head_s, "body_s": body_s, "max_connections": max_connections})
