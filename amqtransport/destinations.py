"""ActiveMQ destination names and wildcards: the one grammar of the broker and the bridge.

A STOMP destination is ``/queue/NAME`` or ``/topic/NAME``; ``/temp-queue/NAME`` and
``/temp-topic/NAME`` name temporary ones (routed as a queue and a topic), which
belong to the connection that names them; another connection reaches one through the
name the broker gives it in a ``reply-to`` header, ``/remote-temp-queue/ID:...`` or
``/remote-temp-topic/ID:...`` (ActiveMQ's spelling; ``Destination.remote``). Where a
person writes destinations (the bridge's config), ActiveMQ's ``queue://NAME`` and
``topic://NAME`` are accepted too (``uri_form=True``) and normalised. NAME is a path
of segments separated by ``.``. Two segments are wildcards, as in ActiveMQ:

- ``*`` matches exactly one segment: ``/queue/a.*`` matches ``/queue/a.b`` but not
  ``/queue/a.b.c`` nor ``/queue/a``;
- ``>`` matches the rest of the path, possibly nothing: ``/queue/a.>`` matches
  ``/queue/a.b`` and ``/queue/a.b.c``, and also ``/queue/a`` itself, as in ActiveMQ
  5.x (``PrefixDestinationFilter``: "A matches A.>"); ``/queue/>`` matches every
  queue. A queue pattern never matches a topic, and no pattern matches a temporary
  destination.

Two readings of a wildcard name, one matching rule (:func:`match`):

- :func:`parse_pattern` is the strict one, for rules a person writes (the bridge's
  include/exclude): a wildcard must be a whole segment (``a.b*`` is refused rather
  than matched literally), ``>`` may only be the last segment, a segment may not be
  empty. Every refusal is a :class:`~amqtransport.errors.DestinationError` naming
  the problem.
- :func:`wildcard_segments` is what the broker does with the destination a client
  subscribes to, as ActiveMQ does: a name is a wildcard when one of its segments is
  exactly ``*`` or ``>``; any other character is literal, and a ``>`` ends the match
  wherever it stands.

:func:`overlaps` decides whether two patterns can match a common destination (the
bridge refuses a wildcard static queue include that overlaps an exclude: it would
have to consume such messages to find out that it must not forward them).

Consumer advisories: the broker publishes ``/topic/ActiveMQ.Advisory.Consumer.Queue.X``
when queue ``X`` gains or loses a consumer; :func:`advisory_name`,
:func:`advisory_topic` and :func:`watched_destination` build and read those names.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from amqtransport.errors import DestinationError

__all__ = [
    "ADVISORY_PREFIX",
    "QUEUE",
    "QUEUE_PREFIX",
    "REMOTE_TEMP_QUEUE_PREFIX",
    "REMOTE_TEMP_TOPIC_PREFIX",
    "TEMP_QUEUE_PREFIX",
    "TEMP_TOPIC_PREFIX",
    "TOPIC",
    "TOPIC_PREFIX",
    "Destination",
    "Pattern",
    "advisory_name",
    "advisory_topic",
    "match",
    "overlaps",
    "parse_destination",
    "parse_pattern",
    "watched_destination",
    "wildcard_segments",
]

QUEUE = "queue"
TOPIC = "topic"
QUEUE_PREFIX = "/queue/"
TOPIC_PREFIX = "/topic/"
TEMP_QUEUE_PREFIX = "/temp-queue/"
TEMP_TOPIC_PREFIX = "/temp-topic/"
#: another connection's temporary destination, as the broker names it in ``reply-to``
REMOTE_TEMP_QUEUE_PREFIX = "/remote-temp-queue/"
REMOTE_TEMP_TOPIC_PREFIX = "/remote-temp-topic/"
#: the consumer advisory topics: ``ActiveMQ.Advisory.Consumer.Queue.X``, ``...Topic.X``
ADVISORY_PREFIX = "ActiveMQ.Advisory.Consumer."

# prefix -> (kind, temporary); the STOMP spellings, then ActiveMQ's URI spellings
_WIRE_PREFIXES = (
    (QUEUE_PREFIX, QUEUE, False),
    (TOPIC_PREFIX, TOPIC, False),
    (TEMP_QUEUE_PREFIX, QUEUE, True),
    (TEMP_TOPIC_PREFIX, TOPIC, True),
    (REMOTE_TEMP_QUEUE_PREFIX, QUEUE, True),
    (REMOTE_TEMP_TOPIC_PREFIX, TOPIC, True),
)
_REMOTE_PREFIXES = (REMOTE_TEMP_QUEUE_PREFIX, REMOTE_TEMP_TOPIC_PREFIX)
_URI_PREFIXES = (
    (QUEUE_PREFIX, QUEUE, False),
    ("queue://", QUEUE, False),
    (TOPIC_PREFIX, TOPIC, False),
    ("topic://", TOPIC, False),
)
_KIND_OF_ADVISORY = {"Queue": QUEUE, "Topic": TOPIC}
_ADVISORY_OF_KIND = {QUEUE: "Queue", TOPIC: "Topic"}


def _split(text: object, *, uri_form: bool) -> tuple[str, str, bool]:
    """``(kind, name, temporary)`` of a destination or pattern; the name may be empty."""
    if not isinstance(text, str):
        raise DestinationError(f"destination must be a string, got {type(text).__name__}")
    for prefix, kind, temporary in _URI_PREFIXES if uri_form else _WIRE_PREFIXES:
        if text.startswith(prefix):
            return kind, text[len(prefix) :], temporary
    if uri_form:
        raise DestinationError(f"destination {text!r} must start with /queue/ or /topic/ (or queue:// / topic://)")
    raise DestinationError(f"destination {text!r} must start with /queue/ or /topic/")


class _Kinded:
    kind: str

    @property
    def is_queue(self) -> bool:
        return self.kind == QUEUE

    @property
    def is_topic(self) -> bool:
        return self.kind == TOPIC


@dataclass(frozen=True)
class Destination(_Kinded):
    """A concrete destination, e.g. ``/queue/orders.eu``."""

    kind: str
    name: str
    temporary: bool = False
    #: another connection's temporary destination (``/remote-temp-queue/``, ``/remote-temp-topic/``)
    remote: bool = False

    @property
    def segments(self) -> tuple[str, ...]:
        return tuple(self.name.split("."))

    def __str__(self) -> str:
        prefix = "remote-temp-" if self.remote else "temp-" if self.temporary else ""
        return f"/{prefix}{self.kind}/{self.name}"


def parse_destination(text: str, *, uri_form: bool = False) -> Destination:
    """Parse a concrete destination: the STOMP spellings (``/queue/``, ``/topic/``,
    ``/temp-queue/``, ``/temp-topic/``, ``/remote-temp-queue/``, ``/remote-temp-topic/``),
    or with ``uri_form`` the ones a person writes (``/queue/``, ``/topic/``,
    ``queue://``, ``topic://``). The name is not checked further: a broker takes any
    name a client gives."""
    kind, name, temporary = _split(text, uri_form=uri_form)
    if not name:
        raise DestinationError(f"destination {text!r} has an empty name")
    return Destination(kind, name, temporary, temporary and text.startswith(_REMOTE_PREFIXES))


@dataclass(frozen=True)
class Pattern(_Kinded):
    """A destination whose name may contain the wildcards ``*`` and ``>``."""

    kind: str
    segments: tuple[str, ...]

    @property
    def name(self) -> str:
        return ".".join(self.segments)

    @property
    def has_wildcard(self) -> bool:
        return any(s in ("*", ">") for s in self.segments)

    def matches(self, destination: Destination | str) -> bool:
        """Whether ``destination`` (a :class:`Destination`, or text in either spelling) matches."""
        dest = parse_destination(destination, uri_form=True) if isinstance(destination, str) else destination
        if dest.kind != self.kind or dest.temporary:
            return False
        return match(self.segments, dest.segments)

    def __str__(self) -> str:
        return f"/{self.kind}/{self.name}"


def parse_pattern(text: str) -> Pattern:
    """Parse a rule a person wrote (``/queue/``, ``/topic/``, ``queue://``, ``topic://``;
    see the module docstring); raises :class:`DestinationError` naming what is wrong."""
    kind, name, _ = _split(text, uri_form=True)
    if not name:
        raise DestinationError(f"destination {text!r} has an empty name")
    segments = tuple(name.split("."))
    for i, seg in enumerate(segments):
        if seg == "":
            raise DestinationError(f"destination {text!r} has an empty segment (segments are separated by '.')")
        if seg == ">" and i != len(segments) - 1:
            raise DestinationError(f"destination {text!r}: '>' may only be the last segment")
        if seg not in ("*", ">") and ("*" in seg or ">" in seg):
            raise DestinationError(
                f"destination {text!r}: wildcards '*' and '>' must be whole segments (segment {seg!r})"
            )
    return Pattern(kind, segments)


def wildcard_segments(name: str) -> tuple[str, ...] | None:
    """The segments of ``name`` when it is a wildcard (one segment is exactly ``*`` or
    ``>``), else None: how the broker reads a name a client subscribes to."""
    segments = tuple(name.split("."))
    return segments if ("*" in segments or ">" in segments) else None


def match(pattern: Sequence[str], segments: Sequence[str]) -> bool:
    """Whether the path ``segments`` matches the wildcard path ``pattern``."""
    for i, seg in enumerate(pattern):
        if seg == ">":
            return True  # the rest, possibly nothing: a.> matches a (ActiveMQ semantics)
        if i >= len(segments) or (seg != "*" and seg != segments[i]):
            return False
    return len(segments) == len(pattern)


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


def overlaps(a: Pattern, b: Pattern) -> bool:
    """True when some concrete destination matches both patterns."""
    return a.kind == b.kind and _overlap(a.segments, b.segments)


def advisory_name(kind: str, name: str) -> str:
    """The name of the consumer-advisory topic watching ``kind`` destination ``name``
    (``queue``, ``events.>`` -> ``ActiveMQ.Advisory.Consumer.Queue.events.>``)."""
    return f"{ADVISORY_PREFIX}{_ADVISORY_OF_KIND[kind]}.{name}"


def advisory_topic(watched: Pattern | Destination) -> str:
    """The consumer-advisory topic watching ``watched`` (a wildcard pattern watches many).

    ``/queue/events.>`` -> ``/topic/ActiveMQ.Advisory.Consumer.Queue.events.>``
    """
    return f"{TOPIC_PREFIX}{advisory_name(watched.kind, watched.name)}"


def watched_destination(advisory: str) -> Destination | None:
    """The destination an advisory topic reports on, or None if ``advisory`` is not one."""
    try:
        kind, name, _ = _split(advisory, uri_form=True)
    except DestinationError:
        return None
    if kind != TOPIC or not name.startswith(ADVISORY_PREFIX):
        return None
    rest = name[len(ADVISORY_PREFIX) :]
    adv_kind, _, watched = rest.partition(".")
    if adv_kind not in _KIND_OF_ADVISORY or not watched:
        return None
    return Destination(_KIND_OF_ADVISORY[adv_kind], watched)
