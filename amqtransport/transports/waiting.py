"""When a caller stops waiting for a request's outcome (pure: the driver passes the time).

Both failover drivers wait the same way: a caller waits for its receipt until its own
``timeout`` (seconds) runs out or, with the URI's ``timeout`` (ms, -1 = never), until the
transport has been disconnected that long in one stretch. The request is then
withdrawn (it is no longer replayed) and :func:`send_timeout` is raised: it names the
idempotency key, so the caller can send again safely.
"""

from __future__ import annotations

from typing import Literal

from amqtransport.errors import SendTimeout
from amqtransport.stomp import IDEMPOTENCY_HEADER, Frame
from amqtransport.transports.base import Receipt

__all__ = ["ReceiptWait", "send_timeout"]


class ReceiptWait:
    """When a caller waiting for a receipt gives up (pure: the driver passes the time).

    ``timeout`` (s, the caller's) ends the wait at its deadline; ``timeout_ms`` (the URI's
    ``timeout``, -1 = never) ends it once the transport has been disconnected that long
    in one stretch. The request is then withdrawn (:meth:`FailoverCore.withdraw`)."""

    def __init__(self, timeout_ms: int, timeout: float | None, now: float) -> None:
        self.timeout_ms = timeout_ms
        self.deadline = None if timeout is None else now + timeout
        self._down_since: float | None = None

    @property
    def slice(self) -> float | None:
        """How long the driver may block before asking again (None: until the outcome)."""
        return None if (self.timeout_ms < 0 and self.deadline is None) else 0.05

    def verdict(self, now: float, connected: bool) -> Literal["deadline", "disconnected"] | None:
        if self.deadline is not None and now >= self.deadline:
            return "deadline"
        if self.timeout_ms < 0 or connected:
            self._down_since = None
            return None
        if self._down_since is None:
            self._down_since = now
        return "disconnected" if (now - self._down_since) * 1000 >= self.timeout_ms else None


def send_timeout(message: str, rec: Receipt | None = None, frame: Frame | None = None) -> SendTimeout:
    """The ``SendTimeout`` for a request given up on (naming its idempotency key, to resend it with)."""
    frame = frame if frame is not None else (rec.frame if rec is not None else None)
    key = frame.get(IDEMPOTENCY_HEADER) if frame is not None else None
    if key is not None:
        message += f" (idempotency key {key}: send it again with that key)"
    return SendTimeout(message, idempotency_key=key, receipt_id=rec.receipt_id if rec is not None else None)
