"""The latency proxy: bytes pass in order, each way later by the delay; a cut drops
every connection and refuses new ones until restored.

Delays are checked loosely (at least the delay, never how fast anything is).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator

import pytest

from acklane.integration.netproxy import LatencyProxy, ProxyProcess, ThreadedProxy


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


@pytest.fixture
async def echo() -> AsyncIterator[int]:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    async with server:
        yield server.sockets[0].getsockname()[1]


async def _round_trip(port: int, payload: bytes) -> tuple[bytes, float]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        started = time.monotonic()
        writer.write(payload)
        await writer.drain()
        got = await reader.readexactly(len(payload))
        return got, time.monotonic() - started
    finally:
        writer.close()


async def test_bytes_pass_in_order_after_the_round_trip(echo: int) -> None:
    async with LatencyProxy("127.0.0.1", echo, delay=0.02) as proxy:
        assert proxy.rtt == pytest.approx(0.04)
        payload = bytes(range(256)) * 2000  # several chunks each way
        got, seconds = await _round_trip(proxy.port, payload)
        assert got == payload
        assert seconds >= 0.04 * 0.9  # at least the round trip (timer slack allowed)
        proxy.rtt = 0.0
        got, _ = await _round_trip(proxy.port, b"no delay now")
        assert got == b"no delay now"
        assert proxy.accepted == 2


async def test_pipelined_chunks_pay_the_delay_once_not_each(echo: int) -> None:
    """Ten writes 5 ms apart come back about 5 ms apart each, not one after another's
    round trip: the delay is per chunk, not the connection held."""
    async with LatencyProxy("127.0.0.1", echo, delay=0.05) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        started = time.monotonic()
        for i in range(10):
            writer.write(b"%02d" % i)
            await writer.drain()
            await asyncio.sleep(0.005)
        got = await reader.readexactly(20)
        seconds = time.monotonic() - started
        writer.close()
        assert got == b"".join(b"%02d" % i for i in range(10))
        # held per connection it would take 10 round trips (1 s); generous bound
        assert 0.1 * 0.9 <= seconds < 0.8


async def test_cut_drops_connections_and_refuses_until_restored(echo: int) -> None:
    async with LatencyProxy("127.0.0.1", echo) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"ping")
        assert await reader.readexactly(4) == b"ping"
        assert proxy.connections == 1
        proxy.cut()
        assert proxy.is_cut and proxy.connections == 0
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            writer.write(b"again")
            await writer.drain()
            await reader.readexactly(5)
        writer.close()
        # a new connection is accepted by the socket, then dropped at once
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            writer.write(b"refused")
            await writer.drain()
            await reader.readexactly(7)
        writer.close()
        assert proxy.refused >= 1
        proxy.restore()
        got, _ = await _round_trip(proxy.port, b"back")
        assert got == b"back"


async def test_unreachable_target_drops_the_client() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    async with LatencyProxy("127.0.0.1", closed_port) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        assert await reader.read(10) == b""
        writer.close()
        assert proxy.refused == 1


def _blocking_round_trip(port: int, payload: bytes) -> bytes:
    """What comes back of ``payload``; b"" when the connection is dropped."""
    got = b""
    with (
        contextlib.suppress(ConnectionError),
        socket.create_connection(("127.0.0.1", port), timeout=5) as sock,
    ):
        sock.sendall(payload)
        while len(got) < len(payload):
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
    return got


async def test_threaded_and_process_proxies_forward_and_cut(echo: int) -> None:
    with ThreadedProxy("127.0.0.1", echo, delay=0.005) as proxy:
        assert await asyncio.to_thread(_blocking_round_trip, proxy.port, b"thread") == b"thread"
        proxy.cut()
        assert await asyncio.to_thread(_blocking_round_trip, proxy.port, b"cut") == b""
        proxy.restore()
        assert await asyncio.to_thread(_blocking_round_trip, proxy.port, b"again") == b"again"
    with ProxyProcess("127.0.0.1", echo, rtt=0.01) as process:
        assert await asyncio.to_thread(_blocking_round_trip, process.port, b"process") == b"process"
        process.cut()
        await asyncio.sleep(0.2)  # the signal lands
        assert await asyncio.to_thread(_blocking_round_trip, process.port, b"cut") == b""
        process.restore()
        await asyncio.sleep(0.2)
        assert await asyncio.to_thread(_blocking_round_trip, process.port, b"again") == b"again"
