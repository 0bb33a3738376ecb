"""A frame sequencer in front of the emulator's AMQP engine: delivery ids as the service
tolerates them.

azure-servicebus's AMQP client can put concurrent transfers on one session with
duplicated or out-of-order delivery ids (renewals from ``AutoLockRenewer``'s worker
threads on one ``$management`` link). Service Bus accepts them; proton, the engine
under this emulator, ends the connection ("sequencing error, expected delivery-id 2,
got 1"). The sequencer sits between the client and proton, one pair of threads per
connection, and passes every byte through except two fields:

- client to server: the ``delivery-id`` of each new transfer is renumbered to the one
  proton expects next on that session (continuation frames keep their delivery's id),
  and the original is remembered;
- server to client: a ``disposition`` proton sends for the client's deliveries names
  them by their original ids again (a range split into one disposition per id when the
  originals are not a range).

A client that numbers its transfers correctly sees no change: nothing is renumbered.
Only AMQP frames are looked at (SASL frames and protocol headers pass as they are);
nothing here decodes a message.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
from dataclasses import dataclass, field

__all__ = ["FrameSequencer"]

log = logging.getLogger("acklane.integration.servicebus")

_BEGIN, _TRANSFER, _DISPOSITION, _END = 0x11, 0x14, 0x15, 0x17
_FIXED = {
    0x40: 0, 0x41: 0, 0x42: 0, 0x43: 0, 0x44: 0, 0x45: 0,
    0x50: 1, 0x51: 1, 0x52: 1, 0x53: 1, 0x54: 1, 0x55: 1, 0x56: 1,
    0x60: 2, 0x61: 2,
    0x70: 4, 0x71: 4, 0x72: 4, 0x73: 4,
    0x80: 8, 0x81: 8, 0x82: 8, 0x83: 8, 0x84: 8, 0x94: 16, 0x98: 16,
}  # fmt: skip
_SIZED1 = {0xA0, 0xA1, 0xA3, 0xC0, 0xC1, 0xE0}
_SIZED4 = {0xB0, 0xB1, 0xB3, 0xD0, 0xD1, 0xF0}


def _skip(buf: bytes, i: int) -> int:
    """The offset just past the AMQP value starting at ``i``."""
    code = buf[i]
    if code == 0x00:  # described: a descriptor, then the value
        return _skip(buf, _skip(buf, i + 1))
    if code in _FIXED:
        return i + 1 + _FIXED[code]
    if code in _SIZED1:
        return i + 2 + buf[i + 1]
    if code in _SIZED4:
        return i + 5 + int.from_bytes(buf[i + 1 : i + 5], "big")
    raise ValueError(f"unknown AMQP type 0x{code:02x}")


def _uint(buf: bytes, i: int) -> int | None:
    code = buf[i]
    if code == 0x43:
        return 0
    if code == 0x52:
        return buf[i + 1]
    if code == 0x70:
        return int.from_bytes(buf[i + 1 : i + 5], "big")
    if code == 0x60:  # ushort (a channel number)
        return int.from_bytes(buf[i + 1 : i + 3], "big")
    return None  # null or another type


def _code(frame: bytes) -> int | None:
    """The performative of an AMQP frame (None for SASL, heartbeat or header frames)."""
    if len(frame) < 12 or frame[5] != 0x00:
        return None
    body = frame[4] * 4
    return frame[body + 2] if frame[body : body + 2] == b"\x00\x53" else None


@dataclass
class _Performative:
    """A frame's performative list: where its fields are, to rewrite one of them."""

    frame: bytes
    code: int
    start: int  # offset of the list's encoding in the frame
    fields: list[tuple[int, int]]  # (start, end) of each field present
    end: int  # offset just past the list

    @classmethod
    def read(cls, frame: bytes) -> _Performative | None:
        if len(frame) < 12 or frame[5] != 0x00:
            return None  # not an AMQP frame (SASL), or an empty (heartbeat) frame
        body = frame[4] * 4
        if frame[body : body + 2] != b"\x00\x53":
            return None
        code = frame[body + 2]
        if code not in (_BEGIN, _TRANSFER, _DISPOSITION, _END):
            return None
        at = body + 3
        kind = frame[at]
        if kind == 0x45:
            return cls(frame, code, at, [], at + 1)
        if kind == 0xC0:
            size, count, first = frame[at + 1], frame[at + 2], at + 3
            end = at + 2 + size
        elif kind == 0xD0:
            size = int.from_bytes(frame[at + 1 : at + 5], "big")
            count = int.from_bytes(frame[at + 5 : at + 9], "big")
            first, end = at + 9, at + 5 + size
        else:
            return None
        fields = []
        i = first
        for _ in range(count):
            j = _skip(frame, i)
            fields.append((i, j))
            i = j
        return cls(frame, code, at, fields, end)

    def uint(self, n: int) -> int | None:
        if n >= len(self.fields):
            return None
        return _uint(self.frame, self.fields[n][0])

    def flag(self, n: int) -> bool:
        if n >= len(self.fields):
            return False
        start, _ = self.fields[n]
        code = self.frame[start]
        return code == 0x41 or (code == 0x56 and self.frame[start + 1] == 1)

    def with_fields(self, replaced: dict[int, bytes]) -> bytes:
        """The frame with some fields re-encoded (sizes of the list and frame fixed)."""
        parts = [
            replaced.get(n, self.frame[start:end]) for n, (start, end) in enumerate(self.fields)
        ]
        items = b"".join(parts)
        count = len(parts)
        if len(items) + 1 <= 255 and count <= 255:
            encoded = bytes([0xC0, len(items) + 1, count]) + items
        else:
            encoded = b"\xd0" + struct.pack(">II", len(items) + 4, count) + items
        out = self.frame[4 : self.start] + encoded + self.frame[self.end :]
        return struct.pack(">I", len(out) + 4) + out


def _encode_uint(value: int) -> bytes:
    return b"\x70" + struct.pack(">I", value & 0xFFFFFFFF)


@dataclass
class _Session:
    expected: int | None = None
    continuing: bool = False  # the last transfer had more=True
    current: int = 0  # the id given to the delivery being transferred
    originals: dict[int, int] = field(default_factory=dict)


class _Connection:
    """What one client connection's two directions share."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sessions: dict[int, _Session] = {}  # by the client's channel
        self.server_to_client: dict[int, int] = {}  # server channel -> client channel

    def inbound(self, frame: bytes) -> bytes:
        """A frame from the client, its transfer's delivery id renumbered if needed."""
        perf = _Performative.read(frame)
        if perf is None:
            return frame
        channel = int.from_bytes(frame[6:8], "big")
        with self.lock:
            if perf.code == _BEGIN:
                self.sessions[channel] = _Session(expected=perf.uint(1))
                return frame
            if perf.code == _END:
                self.sessions.pop(channel, None)
                return frame
            if perf.code != _TRANSFER:
                return frame
            session = self.sessions.setdefault(channel, _Session())
            sent = perf.uint(1)
            if session.continuing:
                wanted = session.current
            elif sent is None:
                return frame
            else:
                if session.expected is None:
                    session.expected = sent
                wanted = session.expected
                session.expected = (session.expected + 1) & 0xFFFFFFFF
                session.current = wanted
                if wanted != sent:
                    session.originals[wanted] = sent
                else:
                    session.originals.pop(wanted, None)
            session.continuing = perf.flag(5)
            if sent is None or sent == wanted:
                return frame
        return perf.with_fields({1: _encode_uint(wanted)})

    def outbound(self, frame: bytes) -> list[bytes]:
        """A frame from proton; a disposition of renumbered deliveries named as sent."""
        if _code(frame) not in (_BEGIN, _DISPOSITION):
            return [frame]  # its transfers above all: nothing to read in them
        perf = _Performative.read(frame)
        if perf is None:
            return [frame]
        channel = int.from_bytes(frame[6:8], "big")
        with self.lock:
            if perf.code == _BEGIN:
                remote = perf.uint(0)
                if remote is not None:
                    self.server_to_client[channel] = remote
                return [frame]
            if perf.code != _DISPOSITION or not perf.flag(0):
                return [frame]  # only proton's dispositions as the receiver
            client = self.server_to_client.get(channel)
            session = self.sessions.get(client) if client is not None else None
            if session is None or not session.originals:
                return [frame]
            first = perf.uint(1)
            if first is None:
                return [frame]
            last = perf.uint(2)
            ids = range(first, (last if last is not None else first) + 1)
            if not any(i in session.originals for i in ids):
                return [frame]
            originals = [session.originals.pop(i, i) for i in ids]
        out = []
        for original in originals:
            replaced = {1: _encode_uint(original)}
            if len(perf.fields) > 2:
                replaced[2] = b"\x40"  # last: null (just this one)
            out.append(perf.with_fields(replaced))
        return out


class _Reader:
    """Whole frames (or 8-byte protocol headers) from a socket, as many at once as one
    read brought (each frame copied out once; the buffer is compacted per read)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()
        self.start = 0  # where the first frame not yet handed out begins

    def _size(self) -> int | None:
        """The size of the frame at ``start`` if all of it is here (0: a broken one)."""
        buf, at = self.buffer, self.start
        if len(buf) - at < 8:
            return None
        if buf[at : at + 4] == b"AMQP":
            return 8
        size = int.from_bytes(buf[at : at + 4], "big")
        if size < 8:
            return 0
        return size if len(buf) - at >= size else None

    def frames(self) -> list[bytes] | None:
        """The next whole frames (reading until there is at least one); None at the end."""
        frames: list[bytes] = []
        while True:
            size = self._size()
            if size == 0:
                return None
            if size is not None:
                frames.append(bytes(self.buffer[self.start : self.start + size]))
                self.start += size
                continue
            if frames:
                return frames
            del self.buffer[: self.start]
            self.start = 0
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buffer += chunk


class FrameSequencer:
    """Listens on the emulator's public address and forwards to proton's own port."""

    def __init__(self, host: str, port: int, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server((host, port), reuse_port=False)
        self.port = int(self.listener.getsockname()[1])

    def serve_forever(self) -> None:
        while True:
            client, _ = self.listener.accept()
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def start(self) -> None:
        threading.Thread(target=self.serve_forever, name="sequencer", daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(self.upstream)
        except OSError:
            client.close()
            return
        for sock in (client, server):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        state = _Connection()
        threading.Thread(target=self._pump, args=(client, server, state, True), daemon=True).start()
        self._pump(server, client, state, False)

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, state: _Connection, inbound: bool) -> None:
        reader = _Reader(src)
        try:
            while True:
                frames = reader.frames()
                if frames is None:
                    break
                out: list[bytes] = []
                for frame in frames:  # what one read brought goes on in one write
                    try:
                        out += [state.inbound(frame)] if inbound else state.outbound(frame)
                    except (ValueError, IndexError):
                        log.exception("sequencer: a frame it could not read passed unchanged")
                        out.append(frame)
                dst.sendall(b"".join(out))
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                src.close()
