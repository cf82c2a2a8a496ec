"""Scheduled delivery (``AMQ_SCHEDULED_DELAY`` / ``PERIOD`` / ``REPEAT`` / ``CRON``), as
ActiveMQ 5.17's scheduler has it: the rules and the timetable, without I/O or a clock.

Theory of operation
-------------------
A SEND with any of the four headers (and ``scheduler_support`` on, the default) is not
routed: it becomes a *job*, a persistent message held under the internal destination
``scheduled:<destination>`` (:func:`job_destination`) whose headers carry its timetable
(``amq-scheduled-due``: when it fires next, epoch ms; ``amq-scheduled-left``: repeats
left; ``amq-scheduled-job``: the job's id). Jobs are written to the journal like any
message (so they are replicated, checkpointed and recovered), and recovery hands them
back to the :class:`Scheduler` rather than to a queue.

When a job fires, one atomic journal record acks it, enqueues the delivered message at
its destination (headers ``AMQ_SCHEDULED_*`` removed, ``scheduledJobId`` added, its
``expires`` moved by the time it waited, as ActiveMQ does) and, if it fires again,
enqueues its successor with the next due time: a crash leaves either the job or the
delivery and its successor, so a restart or a takeover delivers each once, late by the
downtime at most. The delivered message goes out as the record is written, not after
it is durable: if the record is lost (a crash, a full disk) the recovered job fires
again, so a firing's message id is its job's id and due time (``<job>@<due ms>``), and
the consumer's duplicate filter (key@message-id for a scheduled delivery) drops the
second copy. A new job joins the timetable only once its record is durable (on a
replicated master: on the slave too), i.e. once its SEND could be receipted: a job fired
before that could be made again, under another id, from the producer's replay of the
SEND to the next master. A job whose receipt the replication gate refused *for now*
(``NotReceipted``: the slave was lost before it acked, the node stays master) is on this
node's disk and the replay is a duplicate of it: it waits again, and joins once a slave
has it or the peer is known not to have taken over. The broker's core (``core.py``) owns the loop timer and the journal;
this module decides (:func:`read_schedule`, :func:`first_due`, :func:`after_fire`).

ActiveMQ's timetable (``JobSchedulerImpl``): the first delivery is at ``now`` (or the
cron's next time) plus ``DELAY`` when it is positive, else plus ``PERIOD``; then, while
repeats are left, every ``PERIOD`` after the previous delivery, ``REPEAT + 1``
deliveries in all. A cron job without ``REPEAT`` delivers at every cron time, forever;
a cron job with ``REPEAT`` starts, at every cron time, a job of its own (``DELAY``,
``PERIOD``, ``REPEAT``) instead of delivering.

Wrong input is refused with a :class:`~.errors.BadHeader` naming the header: a number
that is not one, a negative delay, period or repeat (ActiveMQ delivers a negative delay
at once; we refuse it, as the issue asks), a cron that does not parse (:mod:`.cron`).

Pure: no I/O, no clock (times are given).
"""

from __future__ import annotations

import heapq
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass

from .cron import Cron, CronError, parse_cron
from .errors import BadHeader
from .message import Message

__all__ = [
    "JOB_PREFIX",
    "SCHEDULE_HEADERS",
    "Schedule",
    "Scheduler",
    "after_fire",
    "delivered_headers",
    "first_due",
    "job_destination",
    "job_headers",
    "job_state",
    "read_schedule",
]

DELAY, PERIOD, REPEAT, CRON = "AMQ_SCHEDULED_DELAY", "AMQ_SCHEDULED_PERIOD", "AMQ_SCHEDULED_REPEAT", "AMQ_SCHEDULED_CRON"
SCHEDULE_HEADERS = frozenset({DELAY, PERIOD, REPEAT, CRON})
JOB_PREFIX = "scheduled:"
_DUE, _LEFT, _JOB = "amq-scheduled-due", "amq-scheduled-left", "amq-scheduled-job"
_INTERNAL = frozenset({_DUE, _LEFT, _JOB})
_JAVA_LONG_MAX = (1 << 63) - 1
_JAVA_INT_MAX = (1 << 31) - 1
_WHOLE = re.compile(r"[+-]?[0-9]+")

Headers = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Schedule:
    """A SEND's timetable: milliseconds, a repeat count (0: once) and maybe a cron."""

    delay: int = 0
    period: int = 0
    repeat: int = 0
    cron: Cron | None = None


def _whole(name: str, text: str, limit: int) -> int:
    t = text.strip()
    if _WHOLE.fullmatch(t) is None:  # (not isdigit(): "¹" is a digit to it, int("¹") fails)
        raise BadHeader(f"{name} must be a whole number of {'times' if name == REPEAT else 'milliseconds'}, got {text!r}")
    value = int(t)
    if value < 0:
        raise BadHeader(f"{name} must not be negative, got {text!r}")
    if value > limit:
        raise BadHeader(f"{name} {text!r} is too large (at most {limit})")
    return value


def read_schedule(headers: Sequence[tuple[str, str]]) -> Schedule | None:
    """The timetable a SEND's headers ask for, or None (no ``AMQ_SCHEDULED_*`` header,
    or only an empty cron). The first occurrence of a header counts (STOMP 1.2)."""
    found: dict[str, str] = {}
    for k, v in headers:
        if k in SCHEDULE_HEADERS and k not in found:
            found[k] = v
    if not found:
        return None
    cron = None
    cron_text = found.get(CRON, "")
    if cron_text.strip():
        try:
            cron = parse_cron(cron_text)
        except CronError as exc:
            raise BadHeader(f"{CRON}: {exc}") from None
    sched = Schedule(
        delay=_whole(DELAY, found[DELAY], _JAVA_LONG_MAX) if DELAY in found else 0,
        period=_whole(PERIOD, found[PERIOD], _JAVA_LONG_MAX) if PERIOD in found else 0,
        repeat=_whole(REPEAT, found[REPEAT], _JAVA_INT_MAX) if REPEAT in found else 0,
        cron=cron,
    )
    if cron is None and DELAY not in found and PERIOD not in found and REPEAT not in found:
        return None  # only an empty cron: ActiveMQ delivers at once too
    return sched


def first_due(sched: Schedule, now: float) -> float:
    """When a job scheduled at ``now`` fires first (epoch seconds)."""
    start = sched.cron.next_after(now) if sched.cron is not None else now
    return start + (sched.delay if sched.delay > 0 else sched.period) / 1000.0


def job_destination(destination: str) -> str:
    return JOB_PREFIX + destination


def job_headers(headers: Headers, *, due: float, left: int, job: str) -> Headers:
    """A job's headers: the SEND's, plus its timetable state."""
    kept = tuple(h for h in headers if h[0] not in _INTERNAL)
    return (*kept, (_DUE, str(round(due * 1000))), (_LEFT, str(left)), (_JOB, job))


@dataclass(frozen=True)
class JobState:
    destination: str
    due: float
    left: int
    job: str
    schedule: Schedule


def job_state(msg: Message) -> JobState:
    """What a job message says about itself (its headers were written by :func:`job_headers`)."""
    h = dict(msg.headers)
    sched = read_schedule(msg.headers) or Schedule()
    return JobState(msg.destination[len(JOB_PREFIX) :], int(h[_DUE]) / 1000.0, int(h[_LEFT]), h[_JOB], sched)


@dataclass(frozen=True)
class Firing:
    """What a job does when it fires: ``deliver`` the message or not (a cron job with
    repeats starts a job instead), and the successor jobs ``(due, left, headers)``."""

    deliver: bool
    successors: tuple[tuple[float, int, Headers], ...]


def after_fire(state: JobState, headers: Headers, now: float) -> Firing:
    """ActiveMQ's rule for what happens when a job fires at ``now``."""
    sched = state.schedule
    if sched.cron is None:  # a plain job: REPEAT more times, every PERIOD
        if state.left > 0:
            return Firing(True, ((now + sched.period / 1000.0, state.left - 1, headers),))
        return Firing(True, ())
    tick = (sched.cron.next_after(now), 0, headers)
    if sched.repeat == 0:
        return Firing(True, (tick,))
    # a cron tick with repeats starts a plain job of its own (its headers without the cron)
    plain = tuple(h for h in headers if h[0] != CRON)
    started = (now + (sched.delay if sched.delay > 0 else sched.period) / 1000.0, sched.repeat, plain)
    return Firing(False, (tick, started))


def delivered_headers(headers: Headers, job: str, now_ms: int, accepted_ms: int) -> Headers:
    """The delivered message's headers: no ``AMQ_SCHEDULED_*`` nor job state,
    ``scheduledJobId`` added, ``expires`` moved by the time it waited."""
    out: list[tuple[str, str]] = []
    for k, v in headers:
        if k in SCHEDULE_HEADERS or k in _INTERNAL or k == "scheduledJobId":
            continue
        if k == "expires":
            try:
                exp = int(v)
            except ValueError:
                exp = 0
            if exp > 0:
                v = str(now_ms + max(0, exp - accepted_ms))
        out.append((k, v))
    out.append(("scheduledJobId", job))
    return tuple(out)


class Scheduler:
    """The jobs waiting to fire, earliest first."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Message]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, job: Message, due: float) -> None:
        heapq.heappush(self._heap, (due, next(self._seq), job))

    def next_due(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> list[Message]:
        """The jobs due at ``now``, in due order."""
        out: list[Message] = []
        while self._heap and self._heap[0][0] <= now:
            out.append(heapq.heappop(self._heap)[2])
        return out
