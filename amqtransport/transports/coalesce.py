"""A combining writer: concurrent frame writes leave in as few system calls as possible.

Theory of operation
-------------------
Every caller appends its bytes to a shared list under a small lock and takes a
sequence number. The first caller that finds no flush in progress becomes the
*flusher*: it takes everything pending, writes it with one ``sink`` call (one
``sendall``), and loops until nothing is pending. Callers that arrive while a flush
is in progress do not touch the socket: a waiting caller (``wait=True``, the default)
sleeps until the flush that carried its bytes has completed and returns, or raises
the error of that flush; a fire-and-forget caller (``wait=False``: heart-beats) returns
as soon as its bytes are queued, because the flusher in progress will take them.

Guarantees:

* **order** -- bytes reach the sink in the order of the appends (one flusher at a
  time, each taking the whole pending list in order). Each call's bytes stay
  contiguous, so frames never interleave.
* **errors** -- a failed sink call breaks the writer: every caller whose bytes were
  in that flush, or queued behind it, gets that ``TransportError``, and so does every
  later call. A caller whose bytes were in a completed flush never sees it. A
  fire-and-forget caller may not see the error of a flush run by another thread (the
  owner's reader thread reports a dead link anyway).
* **no lost wake-up** -- the flusher gives up the role under the same lock appenders
  check it with, so a byte queued is always either taken by the running flusher or
  flushed by its own caller.

The common uncontended case costs one sink call and two acquisitions of the small
lock, as before; under contention N frames cost one call instead of N.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from amqtransport.errors import TransportError, WriteError

__all__ = ["CoalescingWriter"]


class CoalescingWriter:
    """Serialises writes from any thread into one ``sink`` call per flush. See the
    module docstring."""

    def __init__(self, sink: Callable[[bytes], None], *, on_flushed: Callable[[], None] | None = None) -> None:
        self._sink = sink
        self._on_flushed = on_flushed
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._pending: list[bytes] = []
        self._appended = 0  # sequence number of the last append
        self._flushed = 0  # every append <= this is on the wire
        self._flushing = False
        self._waiters = 0
        self._error: TransportError | None = None
        #: statistics (for tests and benchmarks): sink calls and appends
        self.flushes = 0
        self.writes = 0

    @property
    def broken(self) -> TransportError | None:
        """The error that broke the writer, if any."""
        return self._error

    def write(self, data: bytes, *, wait: bool = True) -> None:
        """Queue ``data`` and see it written (``wait``) or queued behind a flush in
        progress (``wait=False``). Raises the ``TransportError`` of the flush that
        carried (or should have carried) the bytes."""
        with self._lock:
            if self._error is not None:
                raise self._error
            self._appended += 1
            seq = self._appended
            self.writes += 1
            if self._flushing:
                self._pending.append(data)
                if not wait:
                    return
                self._waiters += 1
                try:
                    while self._flushed < seq and self._error is None:
                        self._cond.wait()
                finally:
                    self._waiters -= 1
                if self._flushed >= seq:
                    return
                raise self._error  # type: ignore[misc]
            # nothing is pending when no flush runs: our bytes go first, as they are
            self._flushing = True
        self._flush_loop(seq, data, seq)  # its first round is the uncontended write

    def _failed(self, exc: BaseException, seq: int) -> None:
        """A sink call failed: break the writer, wake the waiters, and raise to this
        caller only when the failed flush carried its bytes (append ``seq``)."""
        error = exc if isinstance(exc, TransportError) else WriteError(f"write failed: {exc!r}")
        with self._lock:
            self._error = error  # nothing may follow bytes that did not go out
            self._pending = []
            self._flushing = False
            if self._waiters:
                self._cond.notify_all()
            mine = self._flushed < seq
        if not isinstance(exc, Exception):
            raise exc  # an interrupt
        if mine:  # else the waiters it concerns have it
            if error is exc:
                raise exc
            raise error from exc

    def _flush_loop(self, seq: int, data: bytes, upto: int) -> None:
        """Keep flushing what others queued (``data``: appends up to ``upto``) until
        nothing is pending (called without the lock, as the flusher)."""
        while True:
            try:
                self._sink(data)
            except BaseException as exc:
                self._failed(exc, seq)
                return
            if self._on_flushed is not None:
                self._on_flushed()
            with self._lock:
                self._flushed = upto
                self.flushes += 1
                if self._waiters:
                    self._cond.notify_all()
                pending = self._pending
                if not pending:
                    self._flushing = False
                    return
                self._pending = []
                upto = self._appended
            data = pending[0] if len(pending) == 1 else b"".join(pending)
