"""The states of the failover core and the table of its transitions (h11's
``_state.py`` is the model): :class:`~amqtransport.transports.core.FailoverCore`
changes its state in one place, through :data:`TRANSITIONS`, and an event the table
does not allow in the current state raises :class:`IllegalTransition` instead of being
ignored.

Theory of operation
-------------------
A failover connection is in one :class:`State`. ``connecting`` is the startup's
connect; once a link is up it is ``connected``. A link lost while connected starts a
reconnect (the core asks the driver for one, :class:`~amqtransport.transports.core_actions.Reconnect`)
and the state is ``reconnecting`` until the reconnect installs a link. That reconnect
is still running while the new link replays stepwise after a refusal (``replaying``)
and while the listeners hear ``on_resumed`` (``resuming``); a link lost in those
states makes the running reconnect loop again, no second reconnect starts. The
reconnect ends with ``resumed``. ``failed`` (gave up) and ``closed`` are final. The
diagram of the table is in :mod:`amqtransport.transports.core`'s docstring
(tests/transports/test_core_state.py checks that the two agree). The events:

*installed*: a link's replay is written (``connected --installed--> connected`` is a
priority switch to a better endpoint); *installed_stepwise*: the same after a refusal,
with requests left to replay one at a time; *replayed*: those are done; *lost*: the
current link is gone (only ``connected --lost-->`` starts a reconnect); *resumed*: the
reconnect told the listeners and ends; *gave_up*: the schedule ran out, the login was
refused, or ``maxReconnectAttempts=0``; *close*: the user closes (from any state).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from amqtransport.errors import LocalProtocolError

__all__ = ["ACKABLE", "LINK_UP", "TRANSITIONS", "Event", "IllegalTransition", "State"]


class State(StrEnum):
    """A failover connection's state (a ``str``: ``State.CONNECTED == "connected"``)."""

    NEW = "new"
    CONNECTING = "connecting"
    CONNECTED = "connected"
    RECONNECTING = "reconnecting"
    REPLAYING = "replaying"
    RESUMING = "resuming"
    FAILED = "failed"
    CLOSED = "closed"


Event = Literal["start", "installed", "installed_stepwise", "replayed", "lost", "resumed", "gave_up", "close"]

_S = State
_RECONNECT_RUNNING = (_S.RECONNECTING, _S.REPLAYING, _S.RESUMING)

#: (state, event) -> the next state; anything else raises IllegalTransition
TRANSITIONS: dict[tuple[State, Event], State] = {
    (_S.NEW, "start"): _S.CONNECTING,
    (_S.CONNECTING, "installed"): _S.CONNECTED,
    (_S.CONNECTED, "installed"): _S.CONNECTED,
    (_S.CONNECTED, "lost"): _S.RECONNECTING,
    **{(s, "installed"): _S.RESUMING for s in _RECONNECT_RUNNING},
    **{(s, "installed_stepwise"): _S.REPLAYING for s in _RECONNECT_RUNNING},
    (_S.REPLAYING, "replayed"): _S.RESUMING,
    (_S.REPLAYING, "lost"): _S.RECONNECTING,
    (_S.RESUMING, "lost"): _S.RECONNECTING,
    (_S.RESUMING, "resumed"): _S.CONNECTED,
    **{(s, "gave_up"): _S.FAILED for s in (_S.CONNECTING, _S.CONNECTED, *_RECONNECT_RUNNING)},
    **{(s, "close"): _S.CLOSED for s in State if s is not _S.CLOSED},
}

#: states with a current link that carries ordinary requests
LINK_UP = frozenset({State.CONNECTED, State.RESUMING})
#: states whose current link may carry ACKs (also while it replays stepwise)
ACKABLE = LINK_UP | {State.REPLAYING}


class IllegalTransition(LocalProtocolError):
    """An event the failover core's table does not allow in its current state (a
    driver bug: the core never ignores one silently)."""


def next_state(state: State, event: Event) -> State:
    """The state after ``event`` in ``state``; raises :class:`IllegalTransition`."""
    new = TRANSITIONS.get((state, event))
    if new is None:
        raise IllegalTransition(f"failover core: event {event!r} is not allowed in state {state.value!r}")
    return new
