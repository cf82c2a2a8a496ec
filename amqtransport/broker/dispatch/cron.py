"""``AMQ_SCHEDULED_CRON``: ActiveMQ 5.17's cron dialect, parsed once, asked for the next time.

Theory of operation
-------------------
ActiveMQ's scheduler (``org.apache.activemq.broker.scheduler.CronParser``, read from the
5.17 jar) takes five fields separated by whitespace: minute (0-59), hour (0-23), day
of month (1-31), month (1-12) and day of week (0-6, Sunday is 0). Each field is read as
ActiveMQ reads it, in this order of tests:

- ``*`` or ``?``: every value;
- a token with ``/`` is a *step*: the values of what stands before the ``/`` that are
  multiples of the number after it -- ``*/15`` is 0, 15, 30, 45, and, unlike Vixie cron,
  ``1-10/3`` is 3, 6, 9 (multiples, not "every third from 1");
- a token with ``,`` is a list of tokens; one with ``-`` a range ``a-b``; anything else
  one number.

Ours is stricter where ActiveMQ would compute something odd: a value outside its
field's range, an empty set (``5/10`` has no multiple of 10), a step of 0 or a cron that
never comes (``0 0 30 2 *``) are refused with :class:`CronError` naming the field.

:meth:`Cron.next_after` is the first whole minute strictly after a time whose minute,
hour and month are in their sets and whose day is in both the day-of-month and the
day-of-week set (ActiveMQ's day rule, in the local time zone, as its JVM's ``Calendar``).
It walks month, day, hour and minute by jumps, not minute by minute.

Pure: no I/O (``datetime`` arithmetic on the time it is given).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from datetime import datetime, timedelta

from .errors import BadHeader

__all__ = ["Cron", "CronError", "parse_cron"]

_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12), ("day of week", 0, 6))
_HORIZON_DAYS = 366 * 8  # a cron that does not come within this is refused (leap days come every 4 years)


class CronError(BadHeader, ValueError):
    """A cron entry that does not parse (it comes in the ``AMQ_SCHEDULED_CRON`` header);
    the message names the field."""


def _number(token: str, field: str, text: str) -> int:
    if not token or not token.lstrip("+-").isdigit():
        raise CronError(f"cron {text!r}: {field} {token!r} is not a number")
    return int(token)


def _values(token: str, field: str, lo: int, hi: int, text: str) -> set[int]:
    if token in ("*", "?"):
        return set(range(lo, hi + 1))
    if "/" in token:
        head, _, step_text = token.partition("/")
        step = _number(step_text, field, text)
        if step <= 0:
            raise CronError(f"cron {text!r}: {field} step {step_text!r} must be at least 1")
        return {v for v in _values(head, field, lo, hi, text) if v % step == 0}
    if "," in token:
        out: set[int] = set()
        for part in token.split(","):
            if part:
                out |= _values(part, field, lo, hi, text)
        return out
    if "-" in token:
        a, _, b = token.partition("-")
        first, last = _number(a, field, text), _number(b, field, text)
        return set(range(first, last + 1))
    return {_number(token, field, text)}


@dataclass(frozen=True)
class Cron:
    """A parsed cron entry: the sorted values of each field."""

    text: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]

    def next_after(self, t: float) -> float:
        """The first matching minute strictly after ``t`` (epoch seconds, local time)."""
        at = datetime.fromtimestamp(t).replace(second=0, microsecond=0) + timedelta(minutes=1)
        limit = at + timedelta(days=_HORIZON_DAYS)
        while at < limit:
            if at.month not in self.months:
                year, month = (at.year + 1, 1) if at.month == 12 else (at.year, at.month + 1)
                at = at.replace(year=year, month=month, day=1, hour=0, minute=0)
                continue
            if at.day not in self.days or (at.isoweekday() % 7) not in self.weekdays:
                at = (at + timedelta(days=1)).replace(hour=0, minute=0)
                continue
            if at.hour not in self.hours:
                i = bisect.bisect_right(self.hours, at.hour)
                if i == len(self.hours):
                    at = (at + timedelta(days=1)).replace(hour=0, minute=0)
                else:
                    at = at.replace(hour=self.hours[i], minute=0)
                continue
            i = bisect.bisect_left(self.minutes, at.minute)
            if i == len(self.minutes):
                at = (at + timedelta(hours=1)).replace(minute=0)
                continue
            return at.replace(minute=self.minutes[i]).timestamp()
        raise CronError(f"cron {self.text!r} never comes (no matching minute within {_HORIZON_DAYS} days)")


def parse_cron(text: str) -> Cron:
    """Parse ``text``; :class:`CronError` names what is wrong."""
    tokens = text.split()
    if len(tokens) != len(_FIELDS):
        raise CronError(
            f"cron {text!r} has {len(tokens)} fields; it needs 5: minute hour day-of-month month day-of-week"
        )
    sets: list[tuple[int, ...]] = []
    for token, (field, lo, hi) in zip(tokens, _FIELDS, strict=True):
        values = _values(token, field, lo, hi, text)
        if not values:
            raise CronError(f"cron {text!r}: {field} {token!r} matches no value")
        bad = [v for v in values if not lo <= v <= hi]
        if bad:
            raise CronError(f"cron {text!r}: {field} {min(bad) if min(bad) < lo else max(bad)} is outside {lo}-{hi}")
        sets.append(tuple(sorted(values)))
    cron = Cron(text, sets[0], sets[1], frozenset(sets[2]), frozenset(sets[3]), frozenset(sets[4]))
    cron.next_after(datetime(2026, 1, 1).timestamp())  # refuses a cron that never comes
    return cron
