"""The broker's spans (``amq broker run --otel-endpoint URL``, config key
``otel_endpoint``): one server span per sampled SEND, its children the journal fsync
and, on a replicated master, the wait for the slave, exported over OTLP/HTTP.

Theory of operation
-------------------
A SEND whose ``traceparent`` (:func:`.otlp.parse_traceparent`) has the sampled flag
gets a :class:`TracedCompletion` in place of its completion (the callback that writes
the RECEIPT once the message is durable; ``connection/protocol.py``). Its span starts
when the frame is handled and ends when the completion runs; its parent is the
producer's span, so the broker sits between the client's ``send`` and its consumer in
one trace. Its children:

* ``journal fsync``: from the SEND to the moment its record was on this node's disk
  (the group commit's queueing, write and ``fdatasync``);
* ``replication wait`` (replicated master with a slave attached): from then to the
  slave's ACK. ``ReplicationMaster._run`` sets :attr:`SendTracer.durable_ns` (when the
  batch was on its disk) while it runs the batch's completions; without it the fsync
  child spans the whole wait.

A SEND without a sampled ``traceparent`` costs one header lookup and nothing else; the
lookup is not made at all without an endpoint.

Spans go into a bounded queue (``otel_queue_size``) read by one daemon thread, which
POSTs batches (protobuf, :func:`.otlp.encode_export`) to ``{endpoint}/v1/traces`` with
a short timeout. A full queue drops the span; a failed POST drops its batch; neither
ever waits for the collector, so a broken or unreachable endpoint never blocks or fails
a send. ``/metrics`` counts them: ``amq_otel_spans_exported_total`` and
``amq_otel_spans_dropped_total``.
"""

from __future__ import annotations

import http.client
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

from .otlp import SPAN_KIND_INTERNAL, SPAN_KIND_SERVER, ServerSpan, encode_export, parse_traceparent

__all__ = ["SendTracer", "TracedCompletion", "traces_url"]

log = logging.getLogger(__name__)

Completion = Callable[[BaseException | None], None]

#: at most this many spans per POST
BATCH = 512
#: a POST gives up after this many seconds (its spans are dropped)
POST_TIMEOUT = 2.0


def traces_url(endpoint: str) -> tuple[str, int, str]:
    """``(host, port, path)`` of the OTLP/HTTP traces URL for ``endpoint``
    (``http://host:4318`` -> ``/v1/traces``; a URL with a path is used as it is)."""
    parts = urlsplit(endpoint)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"otel_endpoint must be an http://HOST:PORT URL (OTLP/HTTP), got {endpoint!r}")
    path = parts.path if parts.path not in ("", "/") else "/v1/traces"
    return parts.hostname, parts.port or 4318, path


class TracedCompletion:
    """A SEND's completion that ends its server span when it runs (module docstring)."""

    __slots__ = ("_tracer", "_inner", "trace_id", "parent_id", "destination", "persistent", "start_ns", "durable_ns")

    def __init__(self, tracer: SendTracer, inner: Completion, trace_id: bytes, parent_id: bytes,
                 destination: str, persistent: bool) -> None:
        self._tracer = tracer
        self._inner = inner
        self.trace_id = trace_id
        self.parent_id = parent_id
        self.destination = destination
        self.persistent = persistent
        self.start_ns = time.time_ns()
        self.durable_ns: int | None = None

    def __call__(self, err: BaseException | None) -> None:
        self.durable_ns = self._tracer.durable_ns
        try:
            self._inner(err)
        finally:
            self._tracer.finished(self, err, time.time_ns())


class SendTracer:
    """The spans of one broker (module docstring)."""

    def __init__(self, endpoint: str, *, name: str, queue_size: int = 2048, service: str = "amq-broker") -> None:
        self.host, self.port, self.path = traces_url(endpoint)
        self.name = name
        self.service = service
        self.exported = 0
        #: set by a replicated master while it runs a batch's completions: when the batch
        #: was on its disk (``ReplicationMaster._run``); None otherwise
        self.durable_ns: int | None = None
        self._dropped_full = 0  # counted on the loop thread
        self._dropped_failed = 0  # counted on the exporter thread
        self._queue: queue.Queue[ServerSpan | None] = queue.Queue(maxsize=queue_size)
        self._thread = threading.Thread(target=self._run, name=f"otel-export:{name}", daemon=True)
        self._thread.start()

    @property
    def dropped(self) -> int:
        """Spans dropped: the queue was full, or their POST failed."""
        return self._dropped_full + self._dropped_failed

    # -- loop thread ---------------------------------------------------------------------
    def traced(self, callback: Completion, headers: Iterable[tuple[str, str]], destination: str,
               persistent: bool) -> Completion:
        """``callback``, or a :class:`TracedCompletion` of it when the SEND is sampled."""
        for k, v in headers:
            if k == "traceparent":
                tp = parse_traceparent(v)
                if tp is None or not tp.sampled:
                    return callback
                return TracedCompletion(self, callback, tp.trace_id, tp.span_id, destination, persistent)
        return callback

    def finished(self, tc: TracedCompletion, err: BaseException | None, end_ns: int) -> None:
        span_id = os.urandom(8)
        attrs: dict[str, str | int | bool] = {
            "messaging.system": "amqtransport", "messaging.destination.name": tc.destination,
            "messaging.operation.name": "send", "messaging.operation.type": "send",
            "amqtransport.broker.name": self.name, "amqtransport.persistent": tc.persistent}
        if err is not None:
            attrs["error.type"] = type(err).__qualname__
        spans = [ServerSpan(tc.trace_id, span_id, tc.parent_id, f"send {tc.destination}", SPAN_KIND_SERVER,
                            tc.start_ns, end_ns, attrs, None if err is None else str(err))]
        if tc.persistent:
            durable = tc.durable_ns or end_ns
            spans.append(ServerSpan(tc.trace_id, os.urandom(8), span_id, "journal fsync", SPAN_KIND_INTERNAL,
                                    tc.start_ns, durable))
            if tc.durable_ns is not None:
                spans.append(ServerSpan(tc.trace_id, os.urandom(8), span_id, "replication wait", SPAN_KIND_INTERNAL,
                                        durable, end_ns))
        self.export(spans)

    def export(self, spans: Iterable[ServerSpan]) -> None:
        """Queue ``spans`` for the exporter thread; never waits (a full queue drops them).
        Also used by the bridge agent for its forward spans (``bridge/forwarder.py``)."""
        for span in spans:
            try:
                self._queue.put_nowait(span)
            except queue.Full:
                self._dropped_full += 1

    def close(self) -> None:
        """Stop the exporter thread after what is queued (bounded by the POST timeout)."""
        try:
            self._queue.put(None, timeout=POST_TIMEOUT)
        except queue.Full:
            pass
        self._thread.join(timeout=2 * POST_TIMEOUT)

    # -- exporter thread -------------------------------------------------------------------
    def _run(self) -> None:
        stop = False
        while not stop:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            deadline = time.monotonic() + 0.2  # gather a little
            while len(batch) < BATCH:
                try:
                    item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            self._post(batch)

    def _post(self, batch: list[ServerSpan]) -> None:
        body = encode_export(batch, {"service.name": self.service, "amqtransport.node.name": self.name},
                             "amqtransport", "0.1.0")
        conn = http.client.HTTPConnection(self.host, self.port, timeout=POST_TIMEOUT)
        try:
            conn.request("POST", self.path, body, {"Content-Type": "application/x-protobuf"})
            resp = conn.getresponse()
            resp.read()
            if not 200 <= resp.status < 300:
                raise OSError(f"HTTP {resp.status}")
        except (OSError, http.client.HTTPException) as exc:
            self._dropped_failed += len(batch)
            log.debug("otel export to %s:%s%s failed (%s): %d span(s) dropped", self.host, self.port, self.path,
                      exc, len(batch))
        else:
            self.exported += len(batch)
        finally:
            conn.close()
