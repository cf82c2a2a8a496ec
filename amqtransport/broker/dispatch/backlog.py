"""The backlog of a slow non-durable topic subscriber, bounded in messages *and* bytes.

A topic subscription without credit (its connection not writable, its prefetch full)
keeps what is published meanwhile in a :class:`TopicBacklog`. Topics are not durable:
past ``topic_backlog_limit`` messages or ``topic_backlog_bytes`` bytes (body + headers
+ :data:`~.memory.MESSAGE_OVERHEAD`, as the memory gauge counts a message) the oldest
are dropped, so one slow subscriber of large messages cannot hold gigabytes. (The
bytes are counted per subscription; subscribers of the same topic share the message
objects, so the broker holds at most that much per subscription, often less.)
"""

from __future__ import annotations

from collections import deque

from .memory import message_size
from .message import Message

__all__ = ["TopicBacklog"]


class TopicBacklog:
    __slots__ = ("_items", "bytes", "dropped")

    def __init__(self) -> None:
        self._items: deque[tuple[Message, int]] = deque()
        self.bytes = 0
        self.dropped = 0  # messages dropped so far (oldest first)

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def append(self, msg: Message, max_messages: int, max_bytes: int) -> int:
        """Queue ``msg``; drop the oldest past either bound. Returns how many were dropped."""
        size = message_size(msg)
        self._items.append((msg, size))
        self.bytes += size
        dropped = 0
        while self._items and (len(self._items) > max_messages or self.bytes > max_bytes):
            self.bytes -= self._items.popleft()[1]
            dropped += 1
        self.dropped += dropped
        return dropped

    def appendleft(self, msg: Message) -> None:
        """Put a message back at the front (NACKed: offered again first)."""
        size = message_size(msg)
        self._items.appendleft((msg, size))
        self.bytes += size

    def popleft(self) -> Message:
        msg, size = self._items.popleft()
        self.bytes -= size
        return msg

    def clear(self) -> None:
        self._items.clear()
        self.bytes = 0
