"""The witness of replicated pairs (``amq broker witness``) and a node's side of it.

Theory of operation
-------------------
A two-node pair cannot tell a dead peer from a cut link: without a third party a master
that loses its slave holds every receipt until its peer answers (or an operator runs
``amq broker release``), so one failed machine stops all writes. The witness is that
third party, modelled on corosync's qnetd: a small process on a third host, one for any
number of pairs, that keeps per pair one lease on mastership. Its rules are pure
(:mod:`.lease`); this module is the I/O around them.

The process (:class:`Witness`, :func:`run_witness`) listens on one TCP port. Each
connection sends one STOMP ``CONNECT`` (bounded like an HA port: :class:`.port.HaPortProtocol`)
and gets one answer, ``CONNECTED`` or ``ERROR``:

``amq-witness-status: <pair id>``
    no secret: whether the witness knows the pair, its holder, epoch and lease left, and
    a fresh challenge (``amq-ha-challenge``) for the pair's next signed request;
``amq-witness-renew: <node>`` / ``amq-witness-takeover: <node>`` / ``amq-witness-release: <node>``
    with ``amq-witness-pair``, ``amq-ha-epoch``, ``amq-witness-lease`` (seconds) and
    ``amq-witness-alone`` (renew), signed with the pair's key (:mod:`.auth`: HMAC over
    these headers against the challenge, spent once) -- or, for a pair the witness does
    not know yet, carrying the key itself (``amq-witness-key``, checked against the
    pair id, kept: trust on first use). The answer says ``amq-witness-granted``,
    ``amq-witness-reason`` and ``amq-witness-fence`` (the asker must step down).

State. The pairs' records (every field but the in-memory expiry) are in
``DATA_DIR/witness-state.json``, rewritten -- a temporary file, fsync, rename, fsync of
the directory -- before an answer that changed them is sent; a write that fails is
answered with an ERROR and changes nothing. At start every lease counts as renewed
(:func:`.lease.restored`), so a restarted witness never grants twice.

The node's side (:class:`WitnessClient`): a master renews every ``link_timeout / 3``
(:class:`.master.MasterRole`), saying whether it receipts alone, and releases its lease
when it hands over to its in-sync slave (:func:`.lease.release`); a slave asks for
mastership when its master is lost (:mod:`.decide`, phase ``link-lost``). A lease lasts
:func:`lease_seconds` (1.5 x ``link_timeout``); the node counts it from the moment it
sent the renewal, minus a margin (:data:`LEASE_MARGIN`), so its own view always runs out
before the witness's. The witness unreachable is an answer too: not granted.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from amqtransport.errors import RemoteProtocolError
from amqtransport.stomp import Frame, serialize

from ..store.files import replace_file, write_all
from .auth import AUTH_HEADER, CHALLENGE_HEADER, RequestSigner, RequestVerifier
from .config import HaPortLimits
from .lease import (
    MAX_LEASE,
    MIN_LEASE,
    PairLease,
    dump_state,
    load_state,
    pair_id,
    pair_key,
    parse_request,
    release,
    renew,
    takeover,
    takeover_epoch,
)
from .port import HaPortProtocol, RefusalLog, answer_error
from .wire import ReplicaRefused, ReplicationError, ha_request

__all__ = [
    "ALONE_HEADER", "FENCE_HEADER", "GRANTED_HEADER", "KEY_HEADER", "LEASE_HEADER", "PAIR_HEADER",
    "REASON_HEADER", "RELEASE_HEADER", "RENEW_HEADER", "STATE_FILE", "TAKEOVER_HEADER", "WITNESS_SIGNED", "WITNESS_STATUS",
    "Witness", "WitnessAnswer", "WitnessClient", "lease_seconds", "run_witness",
]

log = logging.getLogger(__name__)

WITNESS_STATUS = "amq-witness-status"
RENEW_HEADER = "amq-witness-renew"
TAKEOVER_HEADER = "amq-witness-takeover"
RELEASE_HEADER = "amq-witness-release"
PAIR_HEADER = "amq-witness-pair"
KEY_HEADER = "amq-witness-key"
LEASE_HEADER = "amq-witness-lease"
ALONE_HEADER = "amq-witness-alone"
GRANTED_HEADER = "amq-witness-granted"
REASON_HEADER = "amq-witness-reason"
FENCE_HEADER = "amq-witness-fence"
#: what the MAC of a witness request covers besides the request header
WITNESS_SIGNED = ("amq-ha-epoch", PAIR_HEADER, LEASE_HEADER, ALONE_HEADER)
STATE_FILE = "witness-state.json"
#: the part of a lease a node does not count on (clock rates, the request's way back)
LEASE_MARGIN = 0.1
_PAIR_ID = re.compile(r"[0-9a-f]{32}")
_KEY = re.compile(r"[0-9a-f]{64}")


#: a lease lasts this many link timeouts (renewed every third of one: four renewals may
#: fail in a row before a master receipting alone holds)
LEASE_LINK_TIMEOUTS = 1.5


def lease_seconds(link_timeout: float) -> float:
    """How long a node's lease lasts: :data:`LEASE_LINK_TIMEOUTS` link timeouts. No rule
    depends on its length (the node's count runs out before the witness's, whatever it
    is), but every takeover waits for it: the slave of a killed master is granted
    mastership only once the lease ran out, so at twice the link timeout a kill cost
    about 2 s with no master (issue 24); at one and a half the lease ends about when the
    slave of a silent master has noticed (one link timeout) and probed it."""
    return min(MAX_LEASE, max(MIN_LEASE, LEASE_LINK_TIMEOUTS * link_timeout))


# ---------------------------------------------------------------------- the witness
class Witness:
    """The witness's requests and state (the module docstring); ``clock``: monotonic seconds."""

    def __init__(self, data_dir: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.data_dir = data_dir
        self.path = data_dir / STATE_FILE
        self.clock = clock
        self.refused = RefusalLog(log)
        self.granted = 0
        self.denied = 0
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            self.pairs: dict[str, PairLease] = {}
        else:
            try:
                self.pairs = load_state(raw, clock())
            except ValueError as exc:
                raise ValueError(f"{self.path}: {exc} (restore it, or remove it only if no pair "
                                 "relies on this witness: a fresh witness may grant what it granted before)") from None
        self._verifiers: dict[str, RequestVerifier] = {}

    def _verifier(self, pid: str) -> RequestVerifier:
        v = self._verifiers.get(pid)
        if v is None:
            v = self._verifiers[pid] = RequestVerifier(self.pairs[pid].key.encode("ascii"))
        return v

    def save(self, pairs: dict[str, PairLease]) -> None:
        """Write ``pairs`` durably: temporary file, fsync, rename, fsync of the directory."""
        data = dump_state(pairs)
        replace_file(self.data_dir, STATE_FILE, lambda fd: write_all(fd, data), mode=0o600)  # it holds the keys

    def handle(self, transport: asyncio.Transport, frame: Frame, peer: str) -> None:
        """Answer the one CONNECT of a connection (the module docstring)."""
        if frame.command not in ("CONNECT", "STOMP"):
            self.refused(peer, f"a {frame.command} frame", "expected CONNECT")
            answer_error(transport, f"expected CONNECT on the witness port, got {frame.command}")
            return
        now = self.clock()
        status = frame.get(WITNESS_STATUS)
        if status is not None:
            self._answer(transport, self._status(status, now))
            return
        request = next((h for h in (RENEW_HEADER, RELEASE_HEADER) if frame.get(h) is not None), TAKEOVER_HEADER)
        node = frame.get(request)
        if node is None:
            answer_error(transport, "this is a witness port (amq broker witness): it answers amq-witness-status, "
                                    "amq-witness-renew, amq-witness-takeover and amq-witness-release requests only")
            return
        try:
            headers = self._answer_request(request, node, frame, now)
        except ValueError as exc:
            self.denied += 1
            self.refused(peer, f"{request} from node {node!r}", str(exc))
            answer_error(transport, f"witness: {exc}")
            return
        self._answer(transport, headers)

    def _status(self, pid: str, now: float) -> dict[str, str]:
        headers = {"amq-witness-pairs": str(len(self.pairs)), "amq-witness-pid": str(os.getpid())}
        p = self.pairs.get(pid)
        headers["amq-witness-known"] = "true" if p is not None else "false"
        if p is not None:
            headers.update({"amq-witness-holder": p.holder, "amq-witness-epoch": str(p.epoch),
                            "amq-witness-alone": "true" if p.alone else "false",
                            "amq-witness-remaining": f"{p.remaining(now):.3f}",
                            CHALLENGE_HEADER: self._verifier(pid).challenge(now)})
        return headers

    def _answer_request(self, request: str, node: str, frame: Frame, now: float) -> dict[str, str]:
        pid = frame.get(PAIR_HEADER) or ""
        if not _PAIR_ID.fullmatch(pid):
            raise ValueError(f"bad {PAIR_HEADER} {pid[:40]!r}")
        if not node or len(node) > 200:
            raise ValueError("bad node name")
        known = self.pairs.get(pid)
        key = frame.get(KEY_HEADER)
        if key is not None:  # trust on first use: the key must be the one the id names
            if not _KEY.fullmatch(key) or pair_id(key) != pid:
                raise ValueError("the pair key does not match the pair id")
            if known is not None and not hmac.compare_digest(known.key, key):
                raise ValueError("the pair key does not match the one this witness keeps")
            current = known or PairLease(key)
        elif known is None:
            raise ValueError("unknown pair (its first request carries its key)")
        else:
            signed = {h: v for h in (request, AUTH_HEADER, *WITNESS_SIGNED) if (v := frame.get(h)) is not None}
            why = self._verifier(pid).check(request, signed, now, WITNESS_SIGNED)
            if why is not None:
                raise ValueError(why)
            current = known
        epoch, lease, alone = parse_request({h: v for h, v in frame.headers})
        if request == RENEW_HEADER:
            verdict = renew(current, node, epoch, alone, lease, now)
        elif request == RELEASE_HEADER:
            verdict = release(current, node, epoch, now)
        else:
            verdict = takeover(current, node, epoch, lease, now)
        if verdict.changed or known is None:
            pairs = {**self.pairs, pid: verdict.lease}
            try:
                self.save(pairs)
            except OSError as exc:
                raise ValueError(f"cannot write {self.path}: {exc.strerror or exc}: nothing granted") from None
        self.pairs[pid] = verdict.lease
        if verdict.granted:
            self.granted += 1
            if request != RENEW_HEADER or verdict.changed:
                log.info("witness: pair %s: %s %s: %s", pid[:8], request.rpartition("-")[2], node, verdict.reason)
        else:
            self.denied += 1
            log.info("witness: pair %s: %s %s refused: %s", pid[:8], request.rpartition("-")[2], node,
                     verdict.reason)
        return {GRANTED_HEADER: "true" if verdict.granted else "false", REASON_HEADER: verdict.reason,
                FENCE_HEADER: "true" if verdict.fence else "false", "amq-witness-holder": verdict.lease.holder,
                "amq-witness-epoch": str(verdict.lease.epoch),
                "amq-witness-remaining": f"{verdict.lease.remaining(now):.3f}"}

    @staticmethod
    def _answer(transport: asyncio.Transport, headers: dict[str, str]) -> None:
        clean = [(k, v.replace("\n", " ")) for k, v in headers.items()]
        transport.write(serialize(Frame.make("CONNECTED", [("version", "1.2"), *clean])))
        transport.close()


async def serve_witness(host: str, port: int, data_dir: Path, say: Callable[[str], None],
                        stop: asyncio.Event) -> None:
    """Serve until ``stop`` is set."""
    witness = Witness(data_dir)
    waiting: set[HaPortProtocol] = set()
    limits = HaPortLimits(max_connections=256)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: HaPortProtocol(witness, limits, waiting), host, port,
                                      reuse_address=True)
    bound = server.sockets[0].getsockname()
    say(f"witness listening on tcp://{bound[0]}:{bound[1]} pairs {len(witness.pairs)} pid {os.getpid()}")
    try:
        await stop.wait()
    finally:
        server.close()


def run_witness(host: str, port: int, data_dir: Path) -> int:
    """Run a witness in the foreground until SIGTERM/SIGINT; returns the exit code."""
    from ..server import stop_on_signals

    def say(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    async def main() -> int:
        stop = asyncio.Event()
        stop_on_signals(asyncio.get_running_loop(), stop.set, lambda: 1)
        await serve_witness(host, port, data_dir, say, stop)
        return 0

    return asyncio.run(main())


# ---------------------------------------------------------------------- a node's side
@dataclass(frozen=True)
class WitnessAnswer:
    """What the witness said (``reached``: it answered at all; ``fence``: step down;
    ``remaining``: the seconds the holder's lease has left by the witness's clock, when it
    said; ``epoch``: the epoch asked for, which a takeover granted must raise to)."""

    granted: bool
    reason: str
    fence: bool = False
    reached: bool = True
    remaining: float | None = None
    epoch: int = 0


def _seconds(text: str | None) -> float | None:
    """A duration header's value; None when absent or not a finite number >= 0."""
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and 0 <= value < float("inf") else None


class WitnessClient:
    """A node's requests to its pair's witness (signed with the key of its cluster secret)."""

    def __init__(self, address: tuple[str, int], secret: bytes, name: str, lease: float) -> None:
        self.address = address
        self.key = pair_key(secret)
        self.pair = pair_id(self.key)
        self.signer = RequestSigner(self.key.encode("ascii"))
        self.name = name
        self.lease = lease
        self.last: WitnessAnswer | None = None
        self.requests = 0

    @property
    def where(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"

    @property
    def up(self) -> bool:
        """The witness answered the last request."""
        return self.last is not None and self.last.reached

    @property
    def state(self) -> str:
        """``up`` (it answered the last request), ``down`` or ``unknown`` (not asked yet)."""
        return "unknown" if self.last is None else "up" if self.last.reached else "down"

    @property
    def last_reason(self) -> str:
        return self.last.reason if self.last is not None else ""

    async def ask(self, request: str, epoch: int, *, alone: bool = False, timeout: float = 1.0) -> WitnessAnswer:
        """One renewal (:data:`RENEW_HEADER`), release or takeover request; a takeover asks for
        ``epoch`` or, when the witness granted a newer one already, for that + 1
        (:func:`.lease.takeover_epoch`; :attr:`WitnessAnswer.epoch` says which)."""
        self.requests += 1
        host, port = self.address
        try:
            st, _r, w = await ha_request(host, port, {WITNESS_STATUS: self.pair}, timeout)
            w.close()
            recorded = st.get("amq-witness-epoch") or ""
            if request == TAKEOVER_HEADER and recorded.isascii() and recorded.isdigit() and len(recorded) <= 18:
                epoch = takeover_epoch(epoch - 1, int(recorded))
            headers = {request: self.name, PAIR_HEADER: self.pair, "amq-ha-epoch": str(epoch),
                       LEASE_HEADER: f"{self.lease:g}", ALONE_HEADER: "true" if alone else "false"}
            challenge = st.get(CHALLENGE_HEADER)
            if st.get("amq-witness-known") == "true" and challenge:
                headers[AUTH_HEADER] = self.signer.sign(request, headers, challenge, signed=WITNESS_SIGNED)
            else:
                headers[KEY_HEADER] = self.key
            frame, _r, w = await ha_request(host, port, headers, timeout)
            w.close()
        except (OSError, TimeoutError, ReplicationError, RemoteProtocolError) as exc:
            refused = isinstance(exc, ReplicaRefused)
            answer = WitnessAnswer(False, f"witness {self.where} {'refused' if refused else 'unreachable'}: {exc}",
                                   reached=refused, epoch=epoch)
        else:
            answer = WitnessAnswer(frame.get(GRANTED_HEADER) == "true", f"witness {self.where}: "
                                   f"{frame.get(REASON_HEADER) or '?'}", fence=frame.get(FENCE_HEADER) == "true",
                                   remaining=_seconds(frame.get("amq-witness-remaining")), epoch=epoch)
        self.last = answer
        return answer
