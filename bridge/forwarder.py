"""Forwarding messages of one destination from one broker to another.

Theory of operation
-------------------
A :class:`DestinationForwarder` owns one subscription on the *source* connection
(``ack=client-individual``, ``prefetch`` in flight) and a thread that loops:

1. receive one message (0.2 s poll so a stop is noticed; no wait while batches are in
   flight), then drain what is already there, up to ``prefetch / 5`` messages: that
   is one batch;
2. for each message decide with :func:`route` whether it may cross this bridge
   (``network_ttl`` and the hop path, below); if so, send it on the *destination*
   connection through a producer window, with the message's own idempotency key (or one
   derived from the source broker and ``message-id``, stable across redeliveries);
3. wait for every receipt of the batch (the producer's flush), and only then ACK each
   source message (``Connection.ack_many``: one ACK frame per message, all in one
   socket write). Up to four batches wait for their receipts while the next one is
   sent (``prefetch`` bounds the total unacknowledged), in order. A receipt that has
   not come within ``receipt_timeout`` (``receipt_timeout_ms``, 30 s by default) ends
   the forwarder like any other failure: a far side that answers heart-beats but no
   longer receipts (or a link nobody noticed was dead) costs a rebuild, not the bridge.

With ``ack_mode = "client"`` the subscription uses STOMP's cumulative ``client`` mode
and a batch is acknowledged with a single ACK of its last message (half the frames on
the source link; the batches complete in order, so that ACK covers nothing unreceipted).

So a message is acknowledged on the source only once the far broker has it durably:
at-least-once across any failure of either side. A failure between the receipts and
the ACKs makes the source redeliver, the copy is forwarded again *with the same key*,
and our broker drops it (ActiveMQ does not dedupe by header: there the far consumer
may see a duplicate). Any exception (a send, a flush, a receive, an ACK) ends the
forwarder and is reported to the bridge through ``on_failure``, which tears the whole
bridge down; nothing unacknowledged is lost, the source redelivers it to the next
bridge.

Hops and loops
--------------
Each forwarded message carries ``amq-network-hops`` (bridges crossed so far) and
``amq-network-path`` (the identities of the brokers it has been on, oldest first,
comma-separated; an identity is a configured name, or the ``+``-joined leaf addresses
of a broker pair, so two processes that describe the same pair by different URIs
still agree). A message may cross a bridge only if ``hops < network_ttl`` and the far
broker is not already on its path. That stops a duplex pair and any ring.

A message that may not cross is *suppressed*:

- on a topic it is acknowledged and dropped: the local subscribers had their own copy;
- on a queue it must stay where it is, for that broker's own consumers. ActiveMQ does
  this inside the broker (a network consumer is never dispatched such a message);
  over STOMP the bridge only sees it once it is dispatched, so the forwarder leaves it
  unacknowledged, unsubscribes (which gives it back to the queue), and subscribes
  again after ``loop_pause_ms``. A queue included in both directions of a duplex
  bridge therefore works, but a message that came from the far side stays at most
  ``loop_pause_ms`` longer in the queue than with ActiveMQ. Prefer dynamic includes
  for queues in duplex bridges.

Tracing
-------
With the agent's ``otel_endpoint``, a message whose ``traceparent`` is sampled gets a
``forward {destination}`` span (parent: the span in its ``traceparent``, the producer's)
from the batch that took it off the source to the far broker's receipt, and crosses
with a ``traceparent`` naming that span, so the far broker's and the consumer's spans
hang under it: one trace across the bridge. Spans go to the agent's exporter
(``amqtransport/broker/tracing.py``), which never makes the forwarder wait.

Conduit: a forwarder is one subscription per destination (wildcards included), however
many consumers the far broker has, so a topic message crosses a bridge once.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from amqtransport.broker.otlp import SPAN_KIND_INTERNAL, ServerSpan, parse_traceparent
from amqtransport.destinations import parse_destination
from amqtransport.stomp import IDEMPOTENCY_HEADER, IDEMPOTENCY_HEADER_ALIASES

from .status import BridgeStatus

__all__ = [
    "HOPS_HEADER",
    "PATH_HEADER",
    "NodeId",
    "Decision",
    "route",
    "forward_headers",
    "derive_key",
    "DestinationForwarder",
]

log = logging.getLogger(__name__)

HOPS_HEADER = "amq-network-hops"
PATH_HEADER = "amq-network-path"

# STOMP transport headers of a MESSAGE that must not be copied onto the forwarded SEND
_NOT_COPIED = {
    "message-id", "destination", "subscription", "ack", "content-length", "receipt", "receipt-id",
    "redelivered", "amq-delivery-count", "transaction", "persistent", "expires-in",
    IDEMPOTENCY_HEADER, HOPS_HEADER, PATH_HEADER,
}


@dataclass(frozen=True)
class NodeId:
    """The identity of a broker (or broker pair) in the hop path."""

    label: str

    @classmethod
    def of(cls, name: str | None, addresses: Iterable[str]) -> NodeId:
        if name:
            return cls(name)
        return cls("+".join(sorted(addresses)))

    @property
    def parts(self) -> frozenset[str]:
        return frozenset(p for p in self.label.split("+") if p)

    def same_as(self, entry: str) -> bool:
        other = frozenset(p for p in entry.split("+") if p)
        return self.label == entry or bool(self.parts & other)


@dataclass(frozen=True)
class Decision:
    forward: bool
    reason: str | None = None  # why not
    hops: int = 0
    path: tuple[str, ...] = ()


def route(headers: Mapping[str, str], *, here: NodeId, there: NodeId, ttl: int) -> Decision:
    """May a message with these headers cross from ``here`` to ``there``?"""
    raw_hops = headers.get(HOPS_HEADER, "0")
    try:
        hops = max(0, int(raw_hops))
    except ValueError:
        hops = 0
    raw_path = headers.get(PATH_HEADER, "")
    path = tuple(p for p in raw_path.split(",") if p)
    if hops >= ttl:
        return Decision(False, f"network_ttl {ttl} reached ({hops} hops)", hops, path)
    if any(there.same_as(p) for p in path):
        return Decision(False, f"loop: {there.label} already on the path", hops, path)
    new_path = path if (path and here.same_as(path[-1])) else (*path, here.label)
    return Decision(True, None, hops + 1, new_path)


def derive_key(headers: Mapping[str, str], *, source: NodeId) -> str:
    """The idempotency key to forward with: the message's own, else one derived from the
    source broker and the message-id (stable across redeliveries of the same message)."""
    for name in (IDEMPOTENCY_HEADER, *IDEMPOTENCY_HEADER_ALIASES):
        if headers.get(name):
            return headers[name]
    mid = headers.get("message-id", "")
    digest = hashlib.sha1(f"{source.label}|{mid}".encode()).hexdigest()[:32]
    return f"bridge-{digest}"


def forward_headers(headers: Mapping[str, str], decision: Decision) -> dict[str, str]:
    out = {k: v for k, v in headers.items() if k not in _NOT_COPIED and k not in IDEMPOTENCY_HEADER_ALIASES}
    out[HOPS_HEADER] = str(decision.hops)
    out[PATH_HEADER] = ",".join(decision.path)
    return out


class DestinationForwarder:
    """One destination (or wildcard), one direction: consume -> send with receipt -> ack."""

    def __init__(
        self,
        *,
        src: Any,
        dst: Any,
        destination: str,
        here: NodeId,
        there: NodeId,
        ttl: int,
        prefetch: int,
        status: BridgeStatus,
        on_failure: Callable[[BaseException], None],
        loop_pause: float = 1.0,
        poll: float = 0.2,
        label: str = "",
        excluded: Callable[[str], bool] | None = None,
        ack_mode: str = "client-individual",
        receipt_timeout: float | None = None,
        tracer: Any = None,
    ) -> None:
        self._tracer = tracer  # the agent's span exporter (module docstring, "Tracing"), or None
        if ack_mode not in ("client-individual", "client"):
            raise ValueError(f"ack_mode must be 'client-individual' or 'client', got {ack_mode!r}")
        self._ack_mode = ack_mode
        self._receipt_timeout = receipt_timeout  # seconds a receipt may take; None: for ever
        self.destination = destination
        self._src = src
        self._dst = dst
        self._here = here
        self._there = there
        self._ttl = ttl
        self._prefetch = prefetch
        # pipelining: up to `depth` batches wait for receipts while the next is sent
        self._depth = 4 if prefetch >= 8 else 1
        self._batch_size = max(1, prefetch // (self._depth + 1))
        self._status = status
        self._on_failure = on_failure
        self._loop_pause = loop_pause
        self._poll = poll
        self._label = label or destination
        self._excluded = excluded
        self._is_queue = parse_destination(destination, uri_form=True).is_queue
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"fwd {self._label}", daemon=True)
        self.subscribed = threading.Event()

    def start(self) -> DestinationForwarder:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # ------------------------------------------------------------------ loop

    def _subscribe(self) -> Any:
        sub = self._src.subscribe(self.destination, ack=self._ack_mode, prefetch=self._prefetch)
        self.subscribed.set()
        return sub

    def _run(self) -> None:
        sub: Any = None
        inflight: deque[_Batch] = deque()
        try:
            while not self._stop.is_set():
                if sub is None:
                    sub = self._subscribe()
                # block for the first message only when nothing is waiting for receipts
                msg = sub.receive(timeout=0 if inflight else self._poll)
                batch: list[Any] = []
                if msg is not None:
                    batch.append(msg)
                    while len(batch) < self._batch_size:
                        more = sub.receive(timeout=0)
                        if more is None:
                            break
                        batch.append(more)
                held = False
                if batch:
                    sent, held = self._start_batch(batch)
                    if sent is not None:
                        inflight.append(sent)
                # complete the oldest batch(es): keep at most `depth` in flight; when
                # nothing new came, complete one (its acks give the source credit again)
                if held:
                    while inflight:
                        self._finish_batch(inflight.popleft())
                elif not batch and inflight:
                    self._finish_batch(inflight.popleft())
                while len(inflight) > self._depth:
                    self._finish_batch(inflight.popleft())
                if held and not self._stop.is_set():
                    # a queue message that must stay on this broker: give it back
                    _quietly(sub.unsubscribe)
                    sub = None
                    self.subscribed.clear()
                    self._stop.wait(self._loop_pause)
        except BaseException as exc:  # noqa: BLE001 - reported to the bridge, which rebuilds
            if not self._stop.is_set():
                log.debug("forwarder %s failed: %r", self._label, exc)
                self._on_failure(exc)
        finally:
            if sub is not None:
                _quietly(sub.unsubscribe)

    def _start_batch(self, batch: list[Any]) -> tuple[_Batch | None, bool]:
        """Send what may cross (without waiting for receipts); returns the batch in
        flight (what to ack once its receipts are in) and whether a queue message was
        held back."""
        to_send: list[tuple[Any, str, dict[str, str], bool, str]] = []
        dropped: list[Any] = []
        held = False
        cut: Any = None  # client (cumulative) mode: the last message that may be acked
        for msg in batch:
            headers: Mapping[str, str] = msg.headers
            actual = headers.get("destination") or self.destination
            if self._excluded is not None and not self._is_queue and self._excluded(actual):
                # a wildcard topic subscription saw an excluded topic: the local
                # subscribers had their own copy; just do not forward it
                self._status.add_suppressed(1)
                dropped.append(msg)
                cut = cut if held else msg
                continue
            decision = route(headers, here=self._here, there=self._there, ttl=self._ttl)
            if not decision.forward:
                log.debug("forwarder %s: not forwarding %s: %s", self._label, headers.get("message-id"), decision.reason)
                self._status.add_suppressed(1)
                if self._is_queue:
                    held = True  # left unacknowledged: it goes back to the queue
                else:
                    dropped.append(msg)
                    cut = cut if held else msg
                continue
            persistent = str(headers.get("persistent", "true")).lower() == "true"
            key = derive_key(headers, source=self._here)
            to_send.append((msg, actual, forward_headers(headers, decision), persistent, key))
            cut = cut if held else msg
        if self._ack_mode == "client":
            # one cumulative ACK; what follows a held message is not acked: it comes back
            # with the held one and is sent again under the same key (dropped far away)
            acks = [cut] if cut is not None else []
        else:
            acks = [m for m, *_ in to_send] + dropped
        if not to_send:
            return (_Batch(None, 0, acks) if acks else None), held
        traces = self._trace(to_send) if self._tracer is not None else []
        producer = self._dst.producer(window=len(to_send))
        started = time.monotonic()
        self._status.add_in_flight(len(to_send))
        try:
            for msg, dest, headers, persistent, key in to_send:
                producer.send(dest, msg.body, headers, persistent=persistent, idempotency_key=key)
        except BaseException:
            self._status.add_in_flight(-len(to_send))
            self._status.add_failed(len(to_send))
            raise
        return _Batch(producer, len(to_send), acks, started, traces), held

    def _trace(self, to_send: list[tuple[Any, str, dict[str, str], bool, str]]) -> list[ServerSpan]:
        """The forward spans of the sampled messages of a batch (ended at its receipts);
        their forwarded ``traceparent`` now names them."""
        spans: list[ServerSpan] = []
        now = time.time_ns()
        for _msg, dest, headers, _persistent, _key in to_send:
            tp = parse_traceparent(headers.get("traceparent", ""))
            if tp is None or not tp.sampled:
                continue
            span_id = os.urandom(8)
            headers["traceparent"] = f"00-{tp.trace_id.hex()}-{span_id.hex()}-01"
            spans.append(ServerSpan(tp.trace_id, span_id, tp.span_id, f"forward {dest}", SPAN_KIND_INTERNAL,
                                    now, now, {"messaging.destination.name": dest,
                                               "amqtransport.bridge": self._label,
                                               HOPS_HEADER: int(headers.get(HOPS_HEADER, "0"))}))
        return spans

    def _finish_batch(self, batch: _Batch) -> None:
        """Wait for the far broker's receipts, then acknowledge on the source."""
        if batch.producer is not None:
            try:
                batch.producer.flush(self._receipt_timeout)
            except BaseException:
                self._status.add_in_flight(-batch.forwarded)
                self._status.add_failed(batch.forwarded)
                raise
            self._status.add_in_flight(-batch.forwarded)
            self._status.forward_seconds.observe(time.monotonic() - batch.started)
            if batch.traces and self._tracer is not None:
                end = time.time_ns()
                for span in batch.traces:
                    span.end_ns = end
                self._tracer.export(batch.traces)
        ack_many = getattr(self._src, "ack_many", None)
        if ack_many is not None:
            ack_many(batch.acks)  # one ACK per message, all in one socket write
        else:  # a connection without batched acks (test fakes)
            for msg in batch.acks:
                msg.ack()
        if batch.forwarded:
            self._status.add_forwarded(batch.forwarded, self.destination)


@dataclass
class _Batch:
    producer: Any  # None when nothing was sent (only drops to acknowledge)
    forwarded: int
    acks: list[Any]
    started: float = 0.0  # time.monotonic() when the batch's first send went out
    traces: list[ServerSpan] = field(default_factory=list)  # forward spans, ended at the receipts


def _quietly(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - best effort during teardown
        log.debug("ignored during teardown: %r", exc)
