"""A TCP proxy that adds network latency and can cut connections, for benches and tests.

The emulators answer at once; real brokers are a few milliseconds away. Put a
:class:`LatencyProxy` between a client and an emulator and every chunk of bytes
read from one side is written to the other ``delay`` seconds later (one way;
``rtt / 2`` each way for a round trip of ``rtt``). Each direction keeps its
order: a chunk is due ``delay`` after it was read, and is written after the
chunks before it; the connection is never held as a whole, so a client that
pipelines requests pays the delay once, as it would on a real network.

:meth:`LatencyProxy.cut` closes every connection at once (both sides reset) and
refuses new ones until :meth:`LatencyProxy.restore`: a broker that went away,
for a client that must reconnect.

In the test's or bench's own event loop::

    async with LatencyProxy("127.0.0.1", broker_port, delay=0.0025) as proxy:
        client = connect(proxy.host, proxy.port)   # 5 ms round trip
        proxy.cut()                                # every connection drops
        proxy.restore()                            # and comes back

In a thread of its own (a client with its own threads, a synchronous test), or in
a process of its own (``python -m acklane.integration.netproxy --target HOST:PORT
--rtt-ms 5``, which prints ``listening on HOST:PORT``; SIGUSR1 cuts, SIGUSR2
restores), so that the proxy's work is not counted in the measured process: see
:class:`ThreadedProxy` and :class:`ProxyProcess`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, Self

__all__ = ["LatencyProxy", "ProxyProcess", "ThreadedProxy", "main"]

#: Bytes read at once from either side.
_CHUNK = 65536
#: Chunks read ahead of the writer per direction before the reader waits (back-pressure).
_READ_AHEAD = 256


class _Link:
    """One proxied connection: a client's and the target's streams, two pumps."""

    def __init__(self, client: asyncio.StreamWriter, upstream: asyncio.StreamWriter) -> None:
        self.writers = (client, upstream)

    def reset(self) -> None:
        """Drop both sides at once (RST where the platform allows), as a lost network does."""
        for writer in self.writers:
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()


class LatencyProxy:
    """Listens on ``listen_host:listen_port`` (a free port by default) and forwards
    each connection to ``target_host:target_port``, ``delay`` seconds later each way.

    ``delay`` may be changed at any time (:attr:`delay`, or :attr:`rtt`); chunks
    already in flight keep the due time they were given, and none overtakes another.
    """

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        delay: float = 0.0,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
    ) -> None:
        if delay < 0:
            raise ValueError(f"delay: {delay} s, expected >= 0")
        self.target = (target_host, target_port)
        self.delay = delay
        self.host = listen_host
        self._wanted_port = listen_port
        self._port: int | None = None
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._cut = False
        #: Connections accepted and forwarded, connections refused while cut.
        self.accepted = self.refused = 0

    @property
    def rtt(self) -> float:
        """The round trip the proxy adds, in seconds (twice :attr:`delay`)."""
        return 2 * self.delay

    @rtt.setter
    def rtt(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"rtt: {seconds} s, expected >= 0")
        self.delay = seconds / 2

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the proxy is not started")
        return self._port

    @property
    def address(self) -> str:
        """``host:port`` to give the client instead of the target's."""
        return f"{self.host}:{self.port}"

    @property
    def connections(self) -> int:
        """Connections open through the proxy now."""
        return len(self._links)

    @property
    def is_cut(self) -> bool:
        return self._cut

    async def start(self) -> Self:
        self._server = await asyncio.start_server(
            self._accept, self.host, self._wanted_port, limit=_CHUNK
        )
        self._port = self._server.sockets[0].getsockname()[1]
        return self

    def cut(self) -> None:
        """Close every connection now and refuse new ones until :meth:`restore`."""
        self._cut = True
        for link in list(self._links):
            link.reset()
        self._links.clear()

    def restore(self) -> None:
        """Accept and forward connections again (after :meth:`cut`)."""
        self._cut = False

    async def aclose(self) -> None:
        """Stop listening, drop every connection, and wait for the pumps to end."""
        if self._server is not None:
            self._server.close()
        self.cut()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # ----------------------------------------------------------------- inside

    def _own(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # asyncio runs this callback as a task of its own; the pumps are ours (aclose).
        if self._cut:
            self.refused += 1
            _Link(writer, writer).reset()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target, limit=_CHUNK)
        except OSError:
            self.refused += 1
            writer.transport.abort()
            return
        if self._cut:  # cut while connecting
            self.refused += 1
            _Link(writer, up_writer).reset()
            return
        self.accepted += 1
        for sock_writer in (writer, up_writer):
            sock = sock_writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        link = _Link(writer, up_writer)
        self._links.add(link)
        self._own(self._connection(link, reader, writer, up_reader, up_writer))

    async def _connection(
        self,
        link: _Link,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
    ) -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._direction(reader, up_writer))
                tg.create_task(self._direction(up_reader, writer))
        except* (OSError, ConnectionError):
            pass  # one side went: both are closed below
        finally:
            self._links.discard(link)
            for side in (writer, up_writer):
                if self._cut:
                    side.transport.abort()
                else:
                    side.close()

    async def _direction(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        """Copy ``source`` to ``sink``, each chunk ``delay`` after it was read, in order."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(_READ_AHEAD)

        async def read() -> None:
            last_due = 0.0
            while chunk := await source.read(_CHUNK):
                # never before a chunk read earlier, even when the delay was lowered
                last_due = max(time.monotonic() + self.delay, last_due)
                await queue.put((last_due, chunk))
            await queue.put((0.0, b""))  # end of stream

        async def write() -> None:
            while True:
                due, chunk = await queue.get()
                if not chunk:
                    with contextlib.suppress(OSError):
                        if sink.can_write_eof():
                            sink.write_eof()  # half-close, passed on
                    return
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                sink.write(chunk)
                await sink.drain()  # at once unless the other side reads slowly

        async with asyncio.TaskGroup() as tg:
            tg.create_task(read())
            tg.create_task(write())


class ThreadedProxy:
    """A :class:`LatencyProxy` on an event loop of its own, in a daemon thread.

    For clients that are not on the caller's event loop (librdkafka's threads, a
    blocking SDK, a synchronous test). :meth:`cut`, :meth:`restore` and :attr:`rtt`
    are safe to call from any thread. A context manager: started on entry, closed
    on exit.
    """

    def __init__(self, target_host: str, target_port: int, **options: Any) -> None:
        self.proxy = LatencyProxy(target_host, target_port, **options)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None

    @property
    def host(self) -> str:
        return self.proxy.host

    @property
    def port(self) -> int:
        return self.proxy.port

    @property
    def address(self) -> str:
        return self.proxy.address

    @property
    def rtt(self) -> float:
        return self.proxy.rtt

    @rtt.setter
    def rtt(self, seconds: float) -> None:
        self._call(lambda: setattr(self.proxy, "rtt", seconds))

    def start(self) -> Self:
        started = threading.Event()
        failure: list[BaseException] = []

        async def serve() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            try:
                await self.proxy.start()
            except BaseException as exc:
                failure.append(exc)
                started.set()
                return
            started.set()
            try:
                await self._stop.wait()
            finally:
                await self.proxy.aclose()

        self._thread = threading.Thread(
            target=asyncio.run, args=(serve(),), name="acklane latency proxy", daemon=True
        )
        self._thread.start()
        started.wait(10)
        if failure:
            raise failure[0]
        return self

    def _call(self, action: Any) -> None:
        if self._loop is None:
            action()
            return
        done = threading.Event()

        def run() -> None:
            try:
                action()
            finally:
                done.set()

        self._loop.call_soon_threadsafe(run)
        done.wait(5)

    def cut(self) -> None:
        self._call(self.proxy.cut)

    def restore(self) -> None:
        self._call(self.proxy.restore)

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)
        self._loop = self._thread = self._stop = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ProxyProcess:
    """``python -m acklane.integration.netproxy`` in a process of its own.

    Its work (a chunk read, held and written twice per message) is then not counted
    against the measured process, on a machine with few cores as much as with many.
    """

    def __init__(
        self, target_host: str, target_port: int, *, rtt: float = 0.0, listen_port: int = 0
    ) -> None:
        self.target = (target_host, target_port)
        self.rtt = rtt
        self.host = "127.0.0.1"
        self._wanted_port = listen_port
        self.port = 0
        self._process: subprocess.Popen[str] | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The proxy process's id while it runs (benches read its CPU time)."""
        return None if self._process is None else self._process.pid

    def start(self) -> Self:
        host, port = self.target
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "acklane.integration.netproxy",
                "--target",
                f"{host}:{port}",
                "--rtt-ms",
                str(self.rtt * 1000),
                "--port",
                str(self._wanted_port),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line.startswith("listening on "):
            self.stop()
            raise RuntimeError(f"the latency proxy did not start: {line!r}")
        self.port = int(line.rsplit(":", 1)[1])
        return self

    def _signal(self, signum: int) -> None:
        if self._process is not None:
            self._process.send_signal(signum)

    def cut(self) -> None:
        self._signal(signal.SIGUSR1)

    def restore(self) -> None:
        self._signal(signal.SIGUSR2)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        if process.stdout is not None:
            process.stdout.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _target(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected HOST:PORT")
    return host, int(port)


async def _serve(args: argparse.Namespace) -> None:
    proxy = LatencyProxy(*args.target, delay=args.rtt_ms / 2000, listen_port=args.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, proxy.cut)
    loop.add_signal_handler(signal.SIGUSR2, proxy.restore)
    async with proxy:
        print(f"listening on {proxy.address}", flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    """``python -m acklane.integration.netproxy --target HOST:PORT [--rtt-ms MS] [--port N]``."""
    parser = argparse.ArgumentParser(description="A TCP proxy that adds a round trip of latency.")
    parser.add_argument("--target", type=_target, required=True, help="HOST:PORT to forward to")
    parser.add_argument("--rtt-ms", type=float, default=0.0, help="round trip added, in ms")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (default: free)")
    args = parser.parse_args(argv)
    if args.rtt_ms < 0:
        parser.error("--rtt-ms: expected >= 0")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args))


if __name__ == "__main__":
    main()
