"""A TCP proxy whose connections can go silent without a reset: a partition, a dead load balancer.

A crashed server resets its connections and clients notice at once; a network path that blackholes packets
gives them nothing to notice: requests get no answer, no FIN, no RST, and only the client's own timeouts can
save it. `StallingProxy` sits between the operator and the API server and plays that fault. It forwards raw
TCP (the API's TLS passes through untouched), so it cannot tell a request from a watch's acknowledgement: a
connection counts as "in use" when its client sends a byte. That is exactly how a real stall bites: a watch
stream the client only listens to keeps flowing while every request that goes out is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from types import TracebackType

CHUNK = 65536


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST, not a FIN (SO_LINGER 0): what the client would get from the target itself."""
    with contextlib.suppress(Exception):
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()


class _Flow:
    """One client connection and, unless it was accepted during a stall, its connection to the target."""

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.dead = False  # a dead flow forwards nothing ever again, in either direction

    def writers(self) -> list[asyncio.StreamWriter]:
        return [w for w in (self.client, self.upstream) if w is not None]


class StallingProxy:
    """Forwards 127.0.0.1:`port` to `host`:`target_port` until `stall()`; see the module docstring.

    After `stall()`, a connection whose client sends a byte is dead for good: that byte and everything after
    it, either way, is read and dropped, and its sockets stay open (no FIN, no RST). Connections accepted
    during the stall are dead from the start (counted in `stalled` on accept) and never reach the target.
    `partition()` is a stall that also kills every established connection at once. `heal()` makes new
    connections forward again; dead ones stay dead. Use: `async with StallingProxy(host, port) as proxy:`,
    then point the client at `proxy.port`; on exit everything is closed and cancelled.
    """

    def __init__(self, host: str, target_port: int) -> None:
        self.host, self.target_port = host, target_port
        self.port = 0
        self.connections = 0  # accepted so far
        self.stalled = 0  # made dead so far
        self._stalling = False
        self._closing = False
        self._server: asyncio.Server | None = None
        self._flows: set[_Flow] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def stall(self) -> None:
        self._stalling = True

    def partition(self) -> None:
        """A stall that blackholes the established connections too: a watch stream the client only reads
        goes silent as well (no FIN, no RST), as every packet of a real network partition is dropped."""
        self._stalling = True
        for flow in self._flows:
            self._kill(flow)

    def heal(self) -> None:
        self._stalling = False

    async def __aenter__(self) -> StallingProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._closing = True
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        writers = [w for flow in self._flows for w in flow.writers()]
        for writer in writers:
            writer.close()
        await asyncio.gather(*(w.wait_closed() for w in writers), return_exceptions=True)
        self._flows.clear()
        await self._server.wait_closed()

    def _kill(self, flow: _Flow) -> None:
        if not flow.dead:
            flow.dead = True
            self.stalled += 1

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A plain callback that starts our own task: a task asyncio made for a coroutine callback could
        not be cancelled at exit without Python 3.11's streams logging an error for it."""
        if self._closing:
            writer.transport.abort()
            return
        self.connections += 1
        flow = _Flow(writer)
        self._flows.add(flow)
        if self._stalling:
            self._kill(flow)  # accepted during a stall: never connected onward
        task = asyncio.get_running_loop().create_task(self._serve(flow, reader))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, flow: _Flow, reader: asyncio.StreamReader) -> None:
        """One accepted connection: held and its bytes dropped if dead from the start, else forwarded."""
        if flow.dead:
            while await reader.read(CHUNK):
                pass  # dropped; the client's EOF gets no FIN back either
            return
        try:
            up_reader, flow.upstream = await asyncio.open_connection(self.host, self.target_port)
        except OSError:
            _reset(flow.client)  # target down: a reset, as the client would see without the proxy
            self._flows.discard(flow)
            return
        await asyncio.gather(
            self._pump(flow, reader, flow.upstream, from_client=True),
            self._pump(flow, up_reader, flow.client, from_client=False),
        )
        if not flow.dead:  # both ways ended with EOF (or a reset passed on): a normal close
            self._flows.discard(flow)
            for w in flow.writers():
                w.close()

    async def _pump(
        self, flow: _Flow, src: asyncio.StreamReader, dst: asyncio.StreamWriter, from_client: bool
    ) -> None:
        """Copy one direction; a client byte during a stall kills the flow, after which all is dropped."""
        try:
            while data := await src.read(CHUNK):
                if from_client and self._stalling:
                    self._kill(flow)
                if flow.dead:
                    continue
                dst.write(data)
                await dst.drain()
            if not flow.dead and dst.can_write_eof():
                dst.write_eof()
        except OSError:
            if not flow.dead:  # a reset on a live flow passes on, as it would without the proxy
                for w in flow.writers():
                    _reset(w)


__all__ = ["StallingProxy"]
