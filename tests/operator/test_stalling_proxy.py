"""The stalling proxy of the fault tests: it forwards, goes silent without a reset, heals for new flows.

The fault tests trust it to play a partition; if it leaked a FIN or a reset (or kept forwarding requests) they
would test a kinder fault than they claim to, so its behaviour is pinned here against a plain TCP server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tests.harness.proxy import StallingProxy

pytestmark = pytest.mark.operator

CHUNK_BYTES = 65536
SILENCE = 0.5  # how long a stalled connection must stay quiet (no data, no EOF) to count as silent


class Target:
    """Echoes each line; on "stream" sends "tick" lines every 20 ms for good (a watch that the client only
    reads). Remembers what reached it, so a test can check that nothing leaked through a stall."""

    def __init__(self) -> None:
        self.received: list[str] = []
        self.tasks: set[asyncio.Task[None]] = set()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            while line := await reader.readline():
                self.received.append(line.decode().strip())
                if line == b"stream\n":
                    while True:
                        writer.write(b"tick\n")
                        await writer.drain()
                        await asyncio.sleep(0.02)
                writer.write(line)
                await writer.drain()
        except (asyncio.CancelledError, OSError):
            pass
        finally:
            writer.close()


@pytest.fixture(autouse=True)
async def loop_errors() -> AsyncIterator[list[dict[str, object]]]:
    """Errors the event loop would only log (a failing callback, a task destroyed pending) fail the test."""
    errors: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, context: errors.append(context))
    yield errors
    assert not errors, f"the event loop reported: {errors}"


@pytest.fixture
async def target() -> AsyncIterator[tuple[Target, int]]:
    state = Target()
    server = await asyncio.start_server(state.serve, "127.0.0.1", 0)
    yield state, int(server.sockets[0].getsockname()[1])
    server.close()
    for task in list(state.tasks):
        task.cancel()
    await asyncio.gather(*state.tasks, return_exceptions=True)
    await server.wait_closed()


async def connect(proxy: StallingProxy) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", proxy.port)


async def ask(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], text: str) -> bytes:
    reader, writer = conn
    writer.write(f"{text}\n".encode())
    await writer.drain()
    return await asyncio.wait_for(reader.readline(), 2)


async def assert_silent(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], text: str) -> None:
    """Send a line: no answer, no EOF and no reset may come back within SILENCE."""
    reader, writer = conn
    writer.write(f"{text}\n".encode())
    await writer.drain()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.read(100), SILENCE)
    assert not reader.at_eof()
    assert not writer.is_closing()


async def ticks(reader: asyncio.StreamReader, n: int) -> None:
    for _ in range(n):
        assert await asyncio.wait_for(reader.readline(), 2) == b"tick\n"


async def test_a_stall_silences_requests_but_not_streams_and_heals_for_new_connections(
    target: tuple[Target, int],
) -> None:
    state, port = target
    async with StallingProxy("127.0.0.1", port) as proxy:
        request = await connect(proxy)
        assert await ask(request, "hello") == b"hello\n"
        stream = await connect(proxy)
        assert await ask(stream, "stream") == b"tick\n"

        proxy.stall()
        await assert_silent(request, "lost")
        await ticks(stream[0], 5)  # the server keeps streaming to a client that sends nothing
        during = await connect(proxy)
        await assert_silent(during, "nobody")
        assert (proxy.stalled, proxy.connections) == (2, 3)

        proxy.heal()
        after = await connect(proxy)
        assert await ask(after, "again") == b"again\n"
        await assert_silent(request, "still lost")  # a dead flow stays dead
        await assert_silent(during, "still nobody")
        await ticks(stream[0], 3)
        assert (proxy.stalled, proxy.connections) == (2, 4)

        conns = [request, stream, during, after]
    assert not any(t in {"lost", "nobody", "still lost", "still nobody"} for t in state.received)
    assert state.received == ["hello", "stream", "again"]
    for _, writer in conns:
        writer.close()
    await asyncio.gather(*(w.wait_closed() for _, w in conns), return_exceptions=True)
    leftover = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and t not in state.tasks]
    assert not leftover, f"the proxy left tasks running: {leftover}"


async def test_a_partition_silences_streams_too_and_heals_for_new_connections(
    target: tuple[Target, int],
) -> None:
    _, port = target
    async with StallingProxy("127.0.0.1", port) as proxy:
        stream = await connect(proxy)
        assert await ask(stream, "stream") == b"tick\n"
        proxy.partition()
        for _ in range(10):  # ticks already in flight may still arrive, then nothing
            try:
                data = await asyncio.wait_for(stream[0].read(CHUNK_BYTES), SILENCE)
            except TimeoutError:
                break  # silent: no data, no EOF
            assert data, "a partition sends no EOF"
        else:
            pytest.fail("the stream kept flowing through a partition")
        assert (proxy.stalled, proxy.connections) == (1, 1)
        proxy.heal()
        after = await connect(proxy)
        assert await ask(after, "again") == b"again\n"
        with pytest.raises(TimeoutError):  # the dead stream stays dead
            await asyncio.wait_for(stream[0].read(CHUNK_BYTES), SILENCE)
        for _, writer in (stream, after):
            writer.close()


async def test_connections_close_normally_and_a_dead_target_resets(target: tuple[Target, int]) -> None:
    _, port = target
    async with StallingProxy("127.0.0.1", port) as proxy:
        reader, writer = await connect(proxy)
        writer.write(b"bye\n")
        writer.write_eof()  # the client's FIN reaches the target, whose close comes back as EOF
        assert await asyncio.wait_for(reader.read(), 2) == b"bye\n"
        writer.close()
    async with StallingProxy("127.0.0.1", _closed_port()) as proxy:
        reader, writer = await connect(proxy)
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(reader.read(), 2)
        writer.close()


def _closed_port() -> int:
    from tests.operator.apiserver import free_port

    return free_port()
