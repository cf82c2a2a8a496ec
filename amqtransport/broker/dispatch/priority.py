"""JMS message priority in queues: higher first, FIFO within a priority.

Theory of operation
-------------------
A SEND's ``priority`` header (0-9, JMS's default 4; :func:`parse_priority` refuses
anything else at SEND) is the message's priority; :func:`priority_of` reads it from the
headers once and caches it on the message, so a message read back from the journal
(recovery, paging, a replica) has the same priority without a field of its own.

A queue with ``prioritized_messages`` on (the default) keeps its resident deque sorted:
priority descending, arrival order within a priority. :func:`insert` puts a new or
paged-in message after every message of its priority or higher (``bisect`` on the
deque: a queue of one priority appends, O(1)); :func:`put_back` puts a redelivered one
*before* the others of its priority (it was handed out first). Dispatch keeps taking
from the front, so everything else (round-robin, selectors, prefetch, expiry) is
unchanged.

Paging. Paged messages wait in the store in arrival order, each with its priority
(one byte in the queue's :class:`~..store.pages.PageList`). A prioritized queue pages
in by priority (highest first, FIFO within a priority: ``PageList.take_top``), and
dispatch pages in not only when its deque runs dry but whenever the highest paged
priority (``Queue.paged_top()``, exact) outranks the resident front -- so the order is
exact however deep the paged backlog and however its priorities are mixed. Why FIFO
holds within a priority: a resident message of priority ``p`` either came back from
the page list (which gives each priority's oldest first) or arrived when nothing of
``p`` or higher was paged, so it is older than every paged ``p``. A new message that
outranks every paged one stays resident (ahead of them) while the window has room;
otherwise it is paged like the others and comes back first. While memory is short and
a selective queue holds messages nobody takes, it does not page in for rank (so order
is exact up to what memory allows). After a restart or a takeover every queue's
messages are paged; a list loaded from a checkpoint does not know their priorities,
and the store reads their headers back once, the first time the queue pages in.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import deque

from .errors import BadHeader, CoreError
from .message import Message

__all__ = ["DEFAULT_PRIORITY", "check_priority", "insert", "parse_priority", "priority_of", "put_back"]

DEFAULT_PRIORITY = 4


def parse_priority(value: str) -> int:
    """The priority a SEND's ``priority`` header gives (:class:`BadHeader` unless 0-9)."""
    v = value.strip()
    if not (v.isascii() and v.isdigit()) or int(v) > 9:
        raise BadHeader(f"priority header must be an integer from 0 to 9, got {value!r}")
    return int(v)


def check_priority(headers: tuple[tuple[str, str], ...]) -> None:
    """Refuse (:class:`BadHeader`) a SEND whose first ``priority`` header is not 0-9."""
    for k, v in headers:
        if k == "priority":
            parse_priority(v)
            return


def priority_of(msg: Message) -> int:
    """``msg``'s priority (cached on it)."""
    p = msg.priority
    if p < 0:
        p = DEFAULT_PRIORITY
        for k, v in msg.headers:
            if k == "priority":
                try:
                    p = parse_priority(v)
                except CoreError:  # checked at SEND: only a foreign record gets here
                    pass
                break
        msg.priority = p
    return p


def _neg(m: Message) -> int:
    return -priority_of(m)


def insert(messages: deque[Message], msg: Message) -> None:
    """Put ``msg`` behind every message of its priority or higher."""
    p = priority_of(msg)
    if not messages or priority_of(messages[-1]) >= p:
        messages.append(msg)
    else:
        messages.insert(bisect_right(messages, -p, key=_neg), msg)


def put_back(messages: deque[Message], msg: Message) -> None:
    """Put ``msg`` (redelivered) before every other message of its priority."""
    p = priority_of(msg)
    if not messages or priority_of(messages[0]) <= p:
        messages.appendleft(msg)
    else:
        messages.insert(bisect_left(messages, -p, key=_neg), msg)
