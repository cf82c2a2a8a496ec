"""The bytes on an HA connection, and the asking side of every HA request.

Theory of operation
-------------------
Every connection between the two nodes of a pair (and from ``amq broker status``)
starts with one STOMP ``CONNECT`` frame and its ``CONNECTED`` or ``ERROR`` answer:
:func:`ha_request` sends one and reads the answer up to its NUL only (binary link
data may follow in the same segment), :func:`probe` is the status request,
:func:`ha_request_sync` the blocking one for the command line, and :func:`ask_peer`
asks each of the peer's addresses in turn, each answer a
:class:`~.decide.PeerAnswer` (what :func:`.decide.decide` reads); :func:`reachable` is a plain TCP connect (the
``--takeover-check`` address). A replication link
then speaks the small binary protocol described in :mod:`.replication` (``u8 kind |
u32 length | payload``); its codec is here and is sans-IO: :func:`pack`,
:func:`record_frames` (bounded SNAP/RECORDS frames), :func:`unpack_records`,
:func:`unpack_seq` and the incremental :class:`WireDecoder`, which refuses a frame
over its limit before buffering it. The master side (:mod:`.replication`) and the
slave side (:mod:`.slave`) both use them.

Errors. The asking side is the HA helpers' boundary: an ``OSError`` of the socket (a
refused connection, a timeout, a reset) leaves :func:`ha_request` and
:func:`ha_request_sync` as a :class:`NodeUnreachable` (:class:`NodeRefused` for a
refusal) with the same message, so everything they raise is an
:class:`~amqtransport.errors.AmqTransportError`; those two are ``OSError`` still, for
the callers that catch one.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from amqtransport.errors import BrokerError, ConnectError, RemoteProtocolError, ServerError
from amqtransport.stomp import Frame
from amqtransport.stomp.session import ClientSession

from ..store import MAX_RECORD
from .auth import CHALLENGE_HEADER, HaRequest
from .decide import PeerAnswer

__all__ = [
    "DEMOTE_HEADER",
    "RELEASE_HEADER",
    "REPLICA_HEADER",
    "STANDBY_ANSWER",
    "STANDBY_HEADER",
    "STANDBY_REASON",
    "STATUS_HEADER",
    "HANDOVER_HEADER",
    "LINK_CHALLENGE_HEADER",
    "ReplicationError",
    "ReplicaRefused",
    "NodeUnreachable",
    "NodeRefused",
    "WireDecoder",
    "pack",
    "pack_records",
    "pack_seq",
    "record_frames",
    "unpack_records",
    "unpack_seq",
    "pack_handover",
    "unpack_handover",
    "ha_request",
    "ha_request_sync",
    "probe",
    "reachable",
    "ask_peer",
    "SNAP",
    "RECORDS",
    "SYNC_END",
    "ACK",
    "PING",
    "BYE",
    "HANDOVER",
]

#: the headers that name a request in its CONNECT frame (the value: the sender's name)
STATUS_HEADER = "amq-ha-status"  # status, no secret
REPLICA_HEADER = "amq-ha-replica"  # a slave links up
#: a master with a higher epoch asks a stale master to step down (the end of a split brain)
DEMOTE_HEADER = "amq-ha-demote"
#: a suspect master asks its peer to stand by
STANDBY_HEADER = "amq-ha-standby"
#: an operator tells a master that holds receipts that its peer is gone for good (amq broker release)
RELEASE_HEADER = "amq-ha-release"
#: the peer's answer to a stand-by request, in its CONNECTED frame
STANDBY_ANSWER = "amq-ha-standby-answer"  # ok | in-sync | refused
STANDBY_REASON = "amq-ha-standby-reason"
#: a master that leaves its role on purpose hands over to its in-sync slave (a HANDOVER
#: frame on the replication link carries this request, signed like the others)
HANDOVER_HEADER = "amq-ha-handover"
#: the challenge a slave puts in its replication CONNECT: the master's handover on that
#: link must answer it (auth.py; decide.py, "Handovers")
LINK_CHALLENGE_HEADER = "amq-ha-link-challenge"

SNAP, RECORDS, SYNC_END, ACK, PING, BYE, HANDOVER = range(1, 8)
KINDS = {SNAP: "SNAP", RECORDS: "RECORDS", SYNC_END: "SYNC_END", ACK: "ACK", PING: "PING", BYE: "BYE",
         HANDOVER: "HANDOVER"}
#: the most headers and bytes a HANDOVER payload may carry
MAX_HANDOVER_HEADERS = 16
MAX_HANDOVER_BYTES = 4096
_HDR = struct.Struct("!BI")
_Q = struct.Struct("!Q")
_I = struct.Struct("!I")
#: bytes of records per SNAP/RECORDS frame (a bigger single record travels alone)
FRAME_BYTES = 4 << 20
#: a frame holds at most one record above FRAME_BYTES, and the journal's records are at
#: most MAX_RECORD bytes: the slave accepts nothing longer
MAX_WIRE_FRAME = MAX_RECORD + _Q.size + _I.size
#: frames a slave sends (ACK, PING, BYE) are tiny: the master accepts nothing longer
MAX_SLAVE_FRAME = 64


class ReplicationError(ServerError):
    """The replication stream is malformed or the link broke."""


class ReplicaRefused(ReplicationError):
    """The master answered the replication CONNECT with an ERROR frame."""


class NodeUnreachable(ReplicationError, ConnectionError):
    """An HA node cannot be reached or did not answer in time (see the module docstring)."""


class NodeRefused(NodeUnreachable, ConnectionRefusedError):
    """Nothing listens at the HA node's address (connection refused)."""


@contextlib.contextmanager
def _os_errors_mapped() -> Iterator[None]:
    """The boundary of the HA helpers: an ``OSError`` becomes a :class:`NodeUnreachable`
    (a refusal a :class:`NodeRefused`) with the same arguments, hence the same message."""
    try:
        yield
    except NodeUnreachable:
        raise
    except ConnectionRefusedError as exc:
        raise NodeRefused(*exc.args) from exc
    except OSError as exc:  # TimeoutError included
        raise NodeUnreachable(*exc.args) from exc


# ---------------------------------------------------------------------- wire (pure)
def pack(kind: int, payload: bytes = b"") -> bytes:
    return _HDR.pack(kind, len(payload)) + payload


def pack_records(kind: int, first_seq: int, payloads: Sequence[bytes]) -> bytes:
    parts = [_Q.pack(first_seq)]
    for p in payloads:
        parts.append(_I.pack(len(p)))
        parts.append(p)
    return pack(kind, b"".join(parts))


def record_frames(
    kind: int, first_seq: int, payloads: Iterable[bytes], max_bytes: int = FRAME_BYTES,
    max_record: int = MAX_RECORD,
) -> Iterator[bytes]:
    """``payloads`` as SNAP/RECORDS frames of at most ``max_bytes`` of records each (a
    record bigger than that goes alone), built one at a time; ``first_seq`` numbers the
    first record of each frame. A record over ``max_record`` (the journal never writes
    one) raises :class:`ReplicationError` instead of a frame no slave would accept."""
    chunk: list[bytes] = []
    size = 0
    seq = first_seq
    for p in payloads:
        n = len(p)
        if n > max_record:
            raise ReplicationError(f"record of {n} bytes is over the {max_record}-byte limit of a journal record")
        if chunk and size + n > max_bytes:
            yield pack_records(kind, seq, chunk)
            seq += len(chunk) if kind == RECORDS else 0
            chunk, size = [], 0
        chunk.append(p)
        size += n + _I.size
    if chunk:
        yield pack_records(kind, seq, chunk)


def unpack_records(payload: bytes) -> tuple[int, list[bytes]]:
    """Inverse of the payload of :func:`pack_records`; ReplicationError on bad input."""
    if len(payload) < _Q.size:
        raise ReplicationError("records frame shorter than its sequence number")
    (first,) = _Q.unpack_from(payload, 0)
    pos = _Q.size
    out: list[bytes] = []
    end = len(payload)
    while pos < end:
        if end - pos < _I.size:
            raise ReplicationError(f"torn record length at offset {pos}")
        (n,) = _I.unpack_from(payload, pos)
        pos += _I.size
        if n > end - pos:
            raise ReplicationError(f"record of {n} bytes overruns the frame at offset {pos}")
        out.append(payload[pos : pos + n])
        pos += n
    return int(first), out


def pack_seq(seq: int) -> bytes:
    """An 8-byte sequence number (the payload of ``SYNC_END`` and ``ACK``)."""
    return _Q.pack(seq)


def unpack_seq(payload: bytes) -> int:
    if len(payload) != _Q.size:
        raise ReplicationError(f"expected an 8-byte sequence number, got {len(payload)} bytes")
    return int(_Q.unpack(payload)[0])


def pack_handover(headers: Mapping[str, str]) -> bytes:
    """A ``HANDOVER`` frame carrying a signed request's ``headers`` (one ``name:value``
    line each, UTF-8; names and values hold no newline, names no colon)."""
    lines = []
    for k, v in headers.items():
        if not k or ":" in k or "\n" in k or "\n" in v:
            raise ReplicationError(f"handover header {k!r} cannot be packed (a colon or a newline)")
        lines.append(f"{k}:{v}")
    payload = "\n".join(lines).encode("utf-8")
    if len(payload) > MAX_HANDOVER_BYTES or len(lines) > MAX_HANDOVER_HEADERS:
        raise ReplicationError(f"handover of {len(lines)} headers, {len(payload)} bytes is over the limit")
    return pack(HANDOVER, payload)


def unpack_handover(payload: bytes) -> dict[str, str]:
    """The headers of a ``HANDOVER`` payload (:func:`pack_handover`); a
    :class:`ReplicationError` naming what is wrong otherwise."""
    if len(payload) > MAX_HANDOVER_BYTES:
        raise ReplicationError(f"handover of {len(payload)} bytes is over the {MAX_HANDOVER_BYTES}-byte limit")
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ReplicationError(f"handover is not UTF-8 (byte {exc.start})") from None
    out: dict[str, str] = {}
    for n, line in enumerate(text.split("\n") if text else [], start=1):
        name, sep, value = line.partition(":")
        if not sep or not name:
            raise ReplicationError(f"handover line {n} is not name:value: {line[:40]!r}")
        if name in out:
            raise ReplicationError(f"handover header {name!r} is repeated")
        out[name] = value
    if len(out) > MAX_HANDOVER_HEADERS:
        raise ReplicationError(f"handover of {len(out)} headers is over the limit of {MAX_HANDOVER_HEADERS}")
    return out


class WireDecoder:
    """Incremental decoder of the binary link protocol (sans-IO); a frame longer than
    ``max_frame`` is refused before it is buffered."""

    def __init__(self, max_frame: int = MAX_WIRE_FRAME) -> None:
        self._buf = bytearray()
        self.max_frame = max_frame

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self._buf += data
        out: list[tuple[int, bytes]] = []
        while len(self._buf) >= _HDR.size:
            kind, length = _HDR.unpack_from(self._buf, 0)
            if kind not in KINDS:
                raise ReplicationError(f"unknown replication frame kind {kind}")
            if length > self.max_frame:
                raise ReplicationError(
                    f"replication {KINDS[kind]} frame of {length} bytes is over the {self.max_frame}-byte limit"
                )
            if len(self._buf) < _HDR.size + length:
                break
            payload = bytes(self._buf[_HDR.size : _HDR.size + length])
            del self._buf[: _HDR.size + length]
            out.append((kind, payload))
        return out


def ha_session(headers: Mapping[str, str], context: str = "") -> ClientSession:
    """The client session of one HA request: a STOMP 1.2 CONNECT to host ``amq-ha``
    without heart-beats, carrying the request's ``headers``."""
    return ClientSession(host="amq-ha", accept_version="1.2", extra_headers=headers.items(), context=context)


def connect_frame(headers: Mapping[str, str]) -> bytes:
    """The CONNECT of an HA request on the wire (:func:`ha_session`)."""
    return ha_session(headers).connect_bytes()


# ---------------------------------------------------------------------- requests
async def ha_request(
    host: str, port: int, headers: Mapping[str, str] | HaRequest, timeout: float
) -> tuple[Frame, asyncio.StreamReader, asyncio.StreamWriter]:
    """Open a connection, send an HA CONNECT, return the answer and the open streams.

    A :class:`~.auth.HaRequest` is signed first against a challenge the node gives in
    the answer to a status request (one more round trip, see :mod:`.auth`). Raises
    :class:`ReplicaRefused` for an ERROR answer, :class:`NodeUnreachable` when the
    node cannot be reached or does not answer in time, :class:`ReplicationError` for
    nonsense.
    """
    with _os_errors_mapped():
        if isinstance(headers, HaRequest):
            challenge = None
            if headers.signer is not None:
                status, _r, writer = await _ha_request(host, port, {STATUS_HEADER: "1"}, timeout)
                writer.close()
                challenge = status.get(CHALLENGE_HEADER)
            headers = headers.signed(challenge)
        return await _ha_request(host, port, headers, timeout)


async def _ha_request(
    host: str, port: int, headers: Mapping[str, str], timeout: float
) -> tuple[Frame, asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    try:
        session = ha_session(headers, f"{host}:{port}: ")
        writer.write(session.connect_bytes())
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise NodeUnreachable(f"no answer from {host}:{port} within {timeout} s")
            # up to the frame's NUL only: binary link data may follow in the same segment
            try:
                data = await asyncio.wait_for(reader.readuntil(b"\x00"), left)
            except asyncio.IncompleteReadError as exc:
                raise ReplicationError(f"{host}:{port} closed the connection before answering") from exc
            except asyncio.LimitOverrunError as exc:
                raise ReplicationError(f"{host}:{port} sent an oversized answer") from exc
            try:
                terms = session.feed(data)
            except BrokerError as exc:
                frame = exc.frame
                raise ReplicaRefused(frame.get("message") or frame.body.decode("utf-8", "replace")) from None
            except ConnectError as exc:
                raise ReplicationError(str(exc)) from exc
            if terms is not None:
                return terms.frame, reader, writer
    except BaseException:
        writer.close()
        raise


async def probe(host: str, port: int, timeout: float) -> dict[str, str] | None:
    """The status headers of the HA node at host:port, or None when unreachable."""
    try:
        frame, _r, writer = await ha_request(host, port, {STATUS_HEADER: "1"}, timeout)
    except (OSError, TimeoutError, ReplicationError, RemoteProtocolError):
        return None
    writer.close()
    return {k: v for k, v in frame.headers}


async def reachable(address: tuple[str, int], timeout: float) -> bool:
    """True when a TCP connect to ``address`` succeeds within ``timeout``."""
    try:
        _r, w = await asyncio.wait_for(asyncio.open_connection(*address), timeout)
    except (OSError, TimeoutError):
        return False
    w.close()
    return True


def _answered(answer: PeerAnswer) -> bool:
    return answer.info is not None


async def ask_peer(
    addresses: Sequence[tuple[str, int]],
    headers: Callable[[], HaRequest] | None,
    timeout: float,
    *,
    until: Callable[[PeerAnswer], bool] = _answered,
) -> list[PeerAnswer]:
    """Ask each address in turn until an answer satisfies ``until`` (default: the first
    that answers): a request built by ``headers()`` (freshly signed each time, e.g. a
    stand-by request), or a plain status probe when ``headers`` is None. An ERROR
    answer to a request is followed by a status probe (is it a master?).

    Status probes change nothing, so they go to every address at once: a silent peer (a
    frozen node's kernel accepts, nothing answers) costs one timeout, not one per
    address (a slave whose master froze probed two addresses for 2 s before it asked the
    witness, issue 24). The answers come back in the addresses' order, cut after the
    first that satisfies ``until``, as in turn; that one ends the wait for the rest."""
    if headers is None:
        return await _probe_all(addresses, timeout, until)
    out: list[PeerAnswer] = []
    for addr in addresses:
        try:
            frame, _r, writer = await ha_request(*addr, headers(), timeout=timeout)
        except ConnectionRefusedError:
            out.append(PeerAnswer(addr, refused=True))
            continue
        except ReplicaRefused as exc:
            info = await probe(*addr, timeout=timeout)
            out.append(PeerAnswer(addr, info=info, error=f"refused: {exc}"))
        except (OSError, TimeoutError, ReplicationError) as exc:
            out.append(PeerAnswer(addr, error=str(exc) or type(exc).__name__))
            continue
        else:
            writer.close()
            out.append(PeerAnswer(addr, info={k: v for k, v in frame.headers}, standby=frame.get(STANDBY_ANSWER),
                                  standby_reason=frame.get(STANDBY_REASON) or ""))
        if until(out[-1]):
            break
    return out


async def _probe_all(addresses: Sequence[tuple[str, int]], timeout: float,
                     until: Callable[[PeerAnswer], bool]) -> list[PeerAnswer]:
    """:func:`ask_peer`'s status probes, all at once (its docstring)."""
    tasks = [asyncio.ensure_future(probe(*addr, timeout=timeout)) for addr in addresses]
    out: list[PeerAnswer] = []
    try:
        for addr, task in zip(addresses, tasks, strict=True):
            info = await task
            out.append(PeerAnswer(addr, info=info, error="" if info is not None else "no answer"))
            if until(out[-1]):
                break
    finally:
        for task in tasks:
            task.cancel()
    return out


def ha_request_sync(
    host: str, port: int, timeout: float = 3.0, headers: Mapping[str, str] | HaRequest | None = None
) -> Frame:
    """Blocking status request (for ``amq broker status``), or an operator's signed
    request (``amq broker release``: an :class:`~.auth.HaRequest`, signed against the
    node's challenge as :func:`ha_request` does): the CONNECTED/ERROR frame;
    :class:`NodeUnreachable` when the node cannot be reached or does not answer."""
    hdrs = {STATUS_HEADER: "1"}
    if isinstance(headers, HaRequest):
        challenge = ha_request_sync(host, port, timeout).get(CHALLENGE_HEADER) if headers.signer else None
        headers = headers.signed(challenge)
    hdrs.update(headers or {})
    session = ha_session(hdrs, f"{host}:{port}: ")
    with _os_errors_mapped(), socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(session.connect_bytes())
        deadline = time.monotonic() + timeout
        while True:
            if time.monotonic() > deadline:
                raise NodeUnreachable(f"no answer from {host}:{port} within {timeout} s")
            data = sock.recv(65536)
            if not data:
                raise NodeUnreachable(f"{host}:{port} closed the connection without answering")
            try:
                terms = session.feed(data)
            except BrokerError as exc:  # the refusal is the answer
                frame: Frame = exc.frame
                return frame
            except ConnectError as exc:
                raise ReplicationError(str(exc)) from exc
            if terms is not None:
                return terms.frame
