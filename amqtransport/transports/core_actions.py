"""The events a failover driver feeds :class:`~amqtransport.transports.core.FailoverCore`
answers with: the *actions* (outputs) of the sans-IO failover core.

A driver carries them out in the order given: :class:`Write` (frames on one link
generation), :class:`Settle` (complete or fail a request), :class:`Notify` (a listener
event), :class:`Close` (a link), :class:`Reconnect` (start the reconnect) and
:class:`ArmIdleTimer`. :class:`Install` is a link being installed: its replay is
written before anything else, then the core is told how that went.

The stepwise replay (after a refusal) asks the core two questions whose answers are
named here rather than coded as ``None``/``False``: what to write next
(:data:`StepwiseNext`: :class:`WriteAlone`, :class:`Skip` or :class:`StopReplay`) and
who is to blame for a request left unanswered (:data:`Blame`: :class:`Refused`,
:class:`StopReplay` or :class:`NoVerdict`). No I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

from amqtransport.errors import BrokerError
from amqtransport.stomp import Frame
from amqtransport.transports.base import Receipt
from amqtransport.transports.replay import TRACK_IDLE_SECONDS, ReplayPlan

__all__ = ["Action", "ArmIdleTimer", "Blame", "Close", "Install", "NoVerdict", "Notify", "Reconnect", "Refused",
           "Settle", "Skip", "StepwiseNext", "StopReplay", "Write", "WriteAlone"]

L = TypeVar("L")


@dataclass(frozen=True)
class Write(Generic[L]):
    """Write ``frames``, in order and in one go, on ``link`` (generation ``generation``).
    A failed write kills the link (its loss then comes back as :meth:`FailoverCore.link_lost`)."""

    link: L
    frames: list[Frame]
    generation: int


@dataclass(frozen=True)
class Settle:
    """Complete ``request`` with ``result`` or fail it with ``error``."""

    request: Receipt
    result: Frame | None = None
    error: BaseException | None = None


@dataclass(frozen=True)
class Notify:
    """Tell the listeners ``event`` (``on_interrupted``, ``on_resumed``, ``on_failed``)."""

    event: str
    arg: object


@dataclass(frozen=True)
class Close(Generic[L]):
    """Close ``link`` (with a DISCONNECT when ``disconnect``)."""

    link: L
    disconnect: bool = True


@dataclass(frozen=True)
class Reconnect:
    """The current link was lost with ``error``: run the reconnect (tell the listeners
    ``on_interrupted``, then walk :meth:`FailoverCore.next_connect`)."""

    error: BaseException


@dataclass(frozen=True)
class ArmIdleTimer:
    """Call :meth:`FailoverCore.barrier` ``delay`` seconds from now, unless already armed."""

    delay: float = TRACK_IDLE_SECONDS


Action = Write[L] | Settle | Notify | Close[L] | Reconnect | ArmIdleTimer


@dataclass
class Install(Generic[L]):
    """A link being installed: write ``plan.batch`` on it at once (under the driver's
    lock: nothing may overtake the replay), then call :meth:`FailoverCore.replay_written`."""

    link: L
    generation: int
    plan: ReplayPlan
    previous: L | None
    actions: list[Action[L]] = field(default_factory=list)


# -- the stepwise replay's answers ----------------------------------------------------------


@dataclass(frozen=True)
class WriteAlone(Generic[L]):
    """Write this one request alone, then wait for its answer."""

    write: Write[L]


@dataclass(frozen=True)
class Skip:
    """The request was settled meanwhile: go on with the next."""


@dataclass(frozen=True)
class StopReplay:
    """The link is no longer the one replaying (lost): stop; the next link replays."""


@dataclass(frozen=True)
class Refused:
    """The request written alone is the one the broker refused: fail it with ``error``
    (the core withdrew it)."""

    error: BrokerError


@dataclass(frozen=True)
class NoVerdict:
    """Nothing to decide: the request was answered, or the link is still replaying."""


StepwiseNext = WriteAlone[L] | Skip | StopReplay
Blame = Refused | StopReplay | NoVerdict
