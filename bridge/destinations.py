"""ActiveMQ destination names and wildcards, for the bridge's include/exclude rules.

A STOMP destination is ``/queue/NAME`` or ``/topic/NAME`` (ActiveMQ's ``queue://NAME`` and
``topic://NAME`` are accepted and normalised). NAME is a path of segments separated by
``.``. In a *pattern* (an include or exclude rule) two segments are special, as in
ActiveMQ:

- ``*`` matches exactly one segment: ``/queue/a.*`` matches ``/queue/a.b`` but not
  ``/queue/a.b.c`` nor ``/queue/a``;
- ``>`` matches the rest of the path and may only be the last segment:
  ``/queue/a.>`` matches ``/queue/a.b`` and ``/queue/a.b.c``, and also ``/queue/a``
  itself, as in ActiveMQ 5.x (``PrefixDestinationFilter``: "A matches A.>") and in our
  broker; ``/queue/>`` matches every queue.

A wildcard must be a whole segment (``a.b*`` is rejected rather than silently matched
literally), a segment may not be empty, and a queue pattern never matches a topic.

:func:`overlaps` decides whether two patterns can match a common destination; the
config loader uses it to refuse a wildcard *static* queue include that overlaps an
exclude: the bridge would have to consume such messages to find out that it must not
forward them, and a queue message consumed by the bridge is gone from the local broker.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from amqtransport.errors import ConfigError

__all__ = [
    "QUEUE",
    "TOPIC",
    "ADVISORY_PREFIX",
    "Destination",
    "DestinationPattern",
    "DestinationFilter",
    "parse_destination",
    "parse_pattern",
    "overlaps",
    "advisory_topic",
    "watched_destination",
]

QUEUE = "queue"
TOPIC = "topic"
ADVISORY_PREFIX = "ActiveMQ.Advisory.Consumer."
_KIND_OF_ADVISORY = {"Queue": QUEUE, "Topic": TOPIC}
_ADVISORY_OF_KIND = {QUEUE: "Queue", TOPIC: "Topic"}


def _split_kind(text: str) -> tuple[str, str]:
    if not isinstance(text, str):
        raise ConfigError(f"destination must be a string, got {type(text).__name__}")
    for kind in (QUEUE, TOPIC):
        for prefix in (f"/{kind}/", f"{kind}://"):
            if text.startswith(prefix):
                return kind, text[len(prefix):]
    raise ConfigError(
        f"destination {text!r} must start with /queue/ or /topic/ (or queue:// / topic://)"
    )


@dataclass(frozen=True)
class Destination:
    """A concrete destination, e.g. ``/queue/orders.eu``."""

    kind: str
    name: str

    @property
    def segments(self) -> tuple[str, ...]:
        return tuple(self.name.split("."))

    @property
    def is_queue(self) -> bool:
        return self.kind == QUEUE

    @property
    def is_topic(self) -> bool:
        return self.kind == TOPIC

    def __str__(self) -> str:
        return f"/{self.kind}/{self.name}"


def parse_destination(text: str) -> Destination:
    """Parse a concrete destination (as found in a MESSAGE frame's ``destination``)."""
    kind, name = _split_kind(text)
    if not name:
        raise ConfigError(f"destination {text!r} has an empty name")
    return Destination(kind, name)


@dataclass(frozen=True)
class DestinationPattern:
    """An include/exclude rule: a destination whose name may contain ``*`` and ``>``."""

    kind: str
    segments: tuple[str, ...]

    @property
    def name(self) -> str:
        return ".".join(self.segments)

    @property
    def has_wildcard(self) -> bool:
        return any(s in ("*", ">") for s in self.segments)

    @property
    def is_queue(self) -> bool:
        return self.kind == QUEUE

    @property
    def is_topic(self) -> bool:
        return self.kind == TOPIC

    def matches(self, destination: Destination | str) -> bool:
        dest = parse_destination(destination) if isinstance(destination, str) else destination
        if dest.kind != self.kind:
            return False
        return _match(self.segments, dest.segments)

    def __str__(self) -> str:
        return f"/{self.kind}/{self.name}"


def parse_pattern(text: str) -> DestinationPattern:
    """Parse an include/exclude rule; raises :class:`ConfigError` naming what is wrong."""
    kind, name = _split_kind(text)
    if not name:
        raise ConfigError(f"destination {text!r} has an empty name")
    segments = tuple(name.split("."))
    for i, seg in enumerate(segments):
        if seg == "":
            raise ConfigError(f"destination {text!r} has an empty segment (segments are separated by '.')")
        if seg == ">" and i != len(segments) - 1:
            raise ConfigError(f"destination {text!r}: '>' may only be the last segment")
        if seg not in ("*", ">") and ("*" in seg or ">" in seg):
            raise ConfigError(
                f"destination {text!r}: wildcards '*' and '>' must be whole segments (segment {seg!r})"
            )
    return DestinationPattern(kind, segments)


def _match(pattern: Sequence[str], path: Sequence[str]) -> bool:
    for i, seg in enumerate(pattern):
        if seg == ">":
            return True  # the rest, possibly nothing: a.> matches a (ActiveMQ semantics)
        if i >= len(path):
            return False
        if seg != "*" and seg != path[i]:
            return False
    return len(path) == len(pattern)


def _overlap(a: Sequence[str], b: Sequence[str]) -> bool:
    if not a and not b:
        return True
    if (a and a[0] == ">") or (b and b[0] == ">"):
        return True  # '>' also matches nothing, so the prefix so far is a common destination
    if not a or not b:
        return False
    if a[0] == "*" or b[0] == "*" or a[0] == b[0]:
        return _overlap(a[1:], b[1:])
    return False


def overlaps(a: DestinationPattern, b: DestinationPattern) -> bool:
    """True when some concrete destination matches both patterns."""
    return a.kind == b.kind and _overlap(a.segments, b.segments)


@dataclass(frozen=True)
class DestinationFilter:
    """Includes minus excludes: exclusion wins, as in ActiveMQ."""

    includes: tuple[DestinationPattern, ...]
    excludes: tuple[DestinationPattern, ...] = ()

    @classmethod
    def of(cls, includes: Iterable[str], excludes: Iterable[str] = ()) -> DestinationFilter:
        return cls(tuple(parse_pattern(p) for p in includes), tuple(parse_pattern(p) for p in excludes))

    def excluded(self, destination: Destination | str) -> bool:
        return any(p.matches(destination) for p in self.excludes)

    def allows(self, destination: Destination | str) -> bool:
        if self.excluded(destination):
            return False
        return any(p.matches(destination) for p in self.includes)


def advisory_topic(pattern: DestinationPattern | Destination) -> str:
    """The consumer-advisory topic watching ``pattern`` (a wildcard pattern watches many).

    ``/queue/events.>`` -> ``/topic/ActiveMQ.Advisory.Consumer.Queue.events.>``
    """
    return f"/topic/{ADVISORY_PREFIX}{_ADVISORY_OF_KIND[pattern.kind]}.{pattern.name}"


def watched_destination(advisory: str) -> Destination | None:
    """The destination an advisory topic reports on, or None if ``advisory`` is not one."""
    try:
        kind, name = _split_kind(advisory)
    except ConfigError:
        return None
    if kind != TOPIC or not name.startswith(ADVISORY_PREFIX):
        return None
    rest = name[len(ADVISORY_PREFIX):]
    adv_kind, _, watched = rest.partition(".")
    if adv_kind not in _KIND_OF_ADVISORY or not watched:
        return None
    return Destination(_KIND_OF_ADVISORY[adv_kind], watched)
