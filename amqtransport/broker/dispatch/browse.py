"""Queue browsing (``browser:true`` on SUBSCRIBE): what a queue holds, nothing consumed.

As ActiveMQ's STOMP connector: the browser receives every message waiting in the queue
when it subscribes (in queue order, filtered by its selector), as ordinary MESSAGE
frames, then one MESSAGE with ``browser:end`` (and ``message-id:0``, no body); nothing
is consumed or counted as delivered, later messages are not shown, and messages already
handed to a consumer (unacknowledged) are not part of the view. The connection layer
writes the frames; this module only takes the snapshot. Paged messages are read back
from the journal (``MessageStore.peek``) in one go: a browse of a very deep queue reads
all of it.
"""

from __future__ import annotations

from amqtransport.selector import Selector

from .message import Message
from .registry import Registry
from .selection import settle, view_of

__all__ = ["browse"]


def browse(reg: Registry, key: str, selector: Selector | None) -> list[Message]:
    """The messages waiting in queue ``key`` now (resident, then paged), unexpired and
    matching ``selector``."""
    q = reg.queues.get(key)
    if q is None:
        return []
    settle(q)
    msgs = list(q.messages)
    paged = reg.paged(q)
    if paged and reg.store is not None:
        msgs += reg.store.peek(q.name, 0, paged)
    now = reg.clock()
    return [
        m
        for m in msgs
        if not (m.expires and m.expires <= now) and (selector is None or selector.matches(view_of(m)))
    ]
