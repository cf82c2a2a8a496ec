"""The failover core: every rule of ``failover:``, with no I/O, no thread and no clock.

Theory of operation
-------------------
h11 keeps HTTP's rules in an object that never touches a socket; this module does the
same for ActiveMQ's failover. :class:`FailoverCore` holds the whole state of a failover
connection and decides; a *driver* owns the sockets, the threads or the event loop,
the clock and the waiting. The thread driver is
:class:`~amqtransport.transports.failover.FailoverTransport` (it calls the core under
its one lock); an asyncio driver calls the same methods from its loop.

*Inputs* are method calls, one per event: a user request (:meth:`request`,
:meth:`subscribe`, :meth:`begin`, ...), a link up (:meth:`link_up`, then
:meth:`replay_written` once the replay is on the wire), a link lost
(:meth:`link_lost`), a frame received (:meth:`on_receipt`, :meth:`on_error`,
:meth:`message_is_current`), a timer fired (:meth:`barrier` for the trackMessages idle
timer) and the reconnect's steps (:meth:`begin_connect`, :meth:`next_connect`,
:meth:`connect_to`, :meth:`connect_race`, :meth:`connect_abandoned`,
:meth:`connect_failed`, :meth:`connect_succeeded`: the connect policy of both drivers,
``reconnect.ConnectPolicy``; a driver only waits, probes and opens links). *Outputs* are the return values
(``core_actions.py``):
:class:`Write` (these frames, on link generation G, in this order), :class:`Settle`
(complete or fail a request), :class:`Notify` (a listener event), :class:`Close` (a link
to close), :class:`Reconnect` (start the reconnect; the core asks for one at a time)
and :class:`ArmIdleTimer`; the connect steps are
:class:`~amqtransport.transports.reconnect.ConnectStep` ("connect to X after D
seconds, probing or not"). A driver executes the actions in the order given.

*States* (:class:`~amqtransport.transports.core_state.State`; the table is
``core_state.TRANSITIONS``, which tests/transports/test_core_state.py checks against
this diagram, event by event; ``a|b`` is either state)::

    new --start--> connecting
    connecting --installed--> connected
    connected --installed--> connected
    connected --lost--> reconnecting
    reconnecting|replaying|resuming --installed--> resuming
    reconnecting|replaying|resuming --installed_stepwise--> replaying
    replaying --replayed--> resuming
    replaying|resuming --lost--> reconnecting
    resuming --resumed--> connected
    connecting|connected|reconnecting|replaying|resuming --gave_up--> failed
    new|connecting|connected|reconnecting|replaying|resuming|failed --close--> closed

The state changes in one place, :meth:`FailoverCore._to`, through the table; an event
the table does not allow raises ``IllegalTransition``. Only a loss while ``connected``
starts a reconnect; the reconnect runs until ``resumed`` (``core_state.py`` says what
each state and event means). A lost link's report is an event only for the current
link: a retired link's report (or one after the end) changes nothing.

*The rules kept here* (each once):

- every request asking for a receipt is in :attr:`pending` from before its write until
  its receipt, its ERROR, a give-up or a close; a new link replays it
  (:func:`~amqtransport.transports.replay.plan_replay`: subscriptions first, then the
  pending requests in send order, then the trackMessages cache);
- the trackMessages cache (:class:`~amqtransport.transports.replay.SendCache`): a
  receipt on link G proves every earlier write on G; one tracked send in
  :data:`~amqtransport.transports.replay.TRACK_RECEIPT_EVERY` asks for a receipt, and an
  idle barrier (BEGIN + receipted ABORT) is asked for when tracked sends pause;
- transactions: one the broker acknowledged on a dead link is rolled back; a COMMIT in
  flight on a dead link is in doubt;
- refusals: an ERROR naming no request makes the next link replay stepwise; the same
  refusal :data:`GIVE_UP_REFUSALS` times with only subscriptions left gives up;
- a link found dead right after its install is a loss (it died together with its
  CONNECTED frame: its reader reported the loss before the link was current). The
  driver passes ``alive`` to :meth:`replay_written`; a dead link then goes through
  :meth:`link_lost` like any other, so the reconnect runs (or, with
  ``maxReconnectAttempts=0``, the transport fails) instead of staying "connected" to a
  link nobody reads;
- ``maxReconnectAttempts=0``: a loss gives up at once; an exhausted schedule gives up
  with :class:`~amqtransport.errors.ReconnectExhausted`.

Links are opaque to the core (type parameter ``L``): it compares them, stores them and
hands them back in actions; whatever it must know of one (alive, its address, the
ERROR that ended it) the driver passes in.
"""

from __future__ import annotations

import itertools
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Generic, TypeVar

from amqtransport.backoff import Attempt
from amqtransport.errors import (
    AmqTransportError,
    ConnectionClosed,
    ReconnectExhausted,
)
from amqtransport.options import FailoverOptions
from amqtransport.stomp import (
    BROKER_STOPPED_HEADER,
    CONNECTION_ENDED_HEADER,
    IN_DOUBT_HEADER,
    Frame,
)
from amqtransport.stomp.session import error_from_frame, error_text
from amqtransport.transports.base import Receipt
from amqtransport.transports.core_actions import (
    Action,
    ArmIdleTimer,
    Blame,
    Close,
    Install,
    Notify,
    NoVerdict,
    Reconnect,
    Refused,
    Settle,
    Skip,
    StepwiseNext,
    StopReplay,
    Write,
    WriteAlone,
)
from amqtransport.transports.core_state import ACKABLE, LINK_UP, Event, State, next_state
from amqtransport.transports.reconnect import ConnectPolicy, ConnectStep
from amqtransport.transports.replay import (
    ReplayPlan,
    Tracking,
    Transactions,
    deletes_durable,
    plan_replay,
    refusal_error,
)
from amqtransport.uri import LeafUri

__all__ = ["GIVE_UP_REFUSALS", "STEPWISE_WAIT", "UNEXPECTED_PAUSE", "Action", "ArmIdleTimer", "Close", "FailoverCore", "Install",
           "Notify", "Reconnect", "Settle", "State", "Write"]

log = logging.getLogger("amqtransport.transports.failover")

L = TypeVar("L")

#: refusals in a row, with nothing but subscriptions to blame, before giving up
GIVE_UP_REFUSALS = 3
#: after a refusal, how long a request replayed on its own may go unanswered before
#: the rest is written anyway
STEPWISE_WAIT = 10.0
#: a reconnect that raised something no driver expects (a bug) is logged and tried again
#: after this pause: the supervisor never ends for it (a client would wait for ever)
UNEXPECTED_PAUSE = 0.5


def _error_text(frame: Frame | None) -> str:
    return error_text(frame) if frame is not None else ""


class FailoverCore(Generic[L]):
    """See the module docstring. Not thread-safe: the driver serializes the calls."""

    def __init__(self, options: FailoverOptions, next_id: Callable[[str], str]) -> None:
        self.options = options
        self._next_id = next_id
        self.state = State.NEW
        self.generation = 0
        #: the current link (None while down)
        self.link: L | None = None
        #: why the transport failed (or the last connect error)
        self.error: AmqTransportError | None = None
        #: requests waiting for their receipt, in send order
        self.pending: dict[str, Receipt] = {}
        self.subs: OrderedDict[str, Frame] = OrderedDict()
        self.txs = Transactions()
        self.backups: list[L] = []
        self._write_positions = itertools.count(1)  # positions of writes, see replay.SendCache
        self.tracking = Tracking(options.track_messages, options.max_cache_size, next_id, self._write_positions)
        #: trackMessages' cache of fire-and-forget sends
        self.cache = self.tracking.cache
        self.refusal: Frame | None = None  # the unmatched ERROR that ended the last link(s)
        self.refusal_streak = 0
        #: the connect policy of the connect or reconnect running now
        self.connecting: ConnectPolicy[LeafUri] = ConnectPolicy(options)
        self.reconnects = 0

    # -- state -----------------------------------------------------------------------------

    def _to(self, event: Event) -> State:
        """The one place the state changes (``core_state.TRANSITIONS``); returns the
        state left. Raises ``IllegalTransition`` for an event not allowed now."""
        old, self.state = self.state, next_state(self.state, event)
        return old

    @property
    def closed(self) -> bool:
        return self.state is State.CLOSED

    def current(self) -> tuple[L, int] | None:
        """The link to write ordinary requests on, and its generation (None while down)."""
        if self.state in LINK_UP and self.link is not None:
            return self.link, self.generation
        return None

    def link_of(self, generation: int) -> L | None:
        """The current link if it is link ``generation`` and may carry ACKs."""
        if generation != self.generation or self.state not in ACKABLE:
            return None
        return self.link

    def check_usable(self) -> None:
        """Raise why a request cannot be made now (closed, failed, not started)."""
        if self.state is State.CLOSED:
            raise ConnectionClosed("connection is closed")
        if self.state is State.FAILED:
            assert self.error is not None
            raise self.error
        if self.state is State.NEW:
            raise RuntimeError("transport not started")

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self._to("start")

    def close(self) -> list[Action[L]]:
        """The user closes: close every link, fail every request."""
        if self.state is State.CLOSED:
            return []
        self._to("close")
        actions: list[Action[L]] = []
        if self.link is not None:
            actions.append(Close(self.link))
        self.link = None
        actions.extend(Close(b, disconnect=False) for b in self.backups)
        self.backups = []
        err = ConnectionClosed("connection closed locally")
        actions.extend(Settle(rec, error=err) for rec in self.pending.values())
        self.pending.clear()
        return actions

    def fail(self, error: AmqTransportError) -> list[Action[L]]:
        """Give up with ``error``: every request fails, listeners hear ``on_failed``."""
        if self.state is State.CLOSED:
            return []
        self._to("gave_up")
        self.error = error
        actions: list[Action[L]] = [Settle(rec, error=error) for rec in self.pending.values()]
        self.pending.clear()
        actions.append(Notify("on_failed", error))
        return actions

    # -- connecting -----------------------------------------------------------------------

    def begin_connect(self, endpoints: Sequence[LeafUri], attempts: Iterator[Attempt[LeafUri]], *,
                      startup: bool, last_error: BaseException | None = None) -> None:
        """A connect (startup) or reconnect starts over ``endpoints`` with this schedule;
        ``last_error``: why (the lost link's error), until an attempt fails."""
        self.connecting.begin(len(endpoints), attempts, startup=startup, last_error=last_error)

    def next_connect(self) -> ConnectStep[LeafUri]:
        """The next connect step: wait ``step.delay`` (probing when ``step.probe``), then
        call :meth:`connect_to`. Raises ``ConnectionClosed`` when the transport was
        closed meanwhile, and the ``ReconnectExhausted`` to give up with when the
        schedule ran out."""
        self._check_connecting()
        step = self.connecting.plan.next_step()
        if step is None:
            raise self.connecting.exhausted()
        return step

    def connect_to(self, step: ConnectStep[LeafUri], probed: LeafUri | None = None) -> LeafUri:
        """The step's wait is over: the endpoint to open now (``probed``: one a probe saw
        accept during the wait). Raises ``ConnectionClosed`` if closed meanwhile."""
        self._check_connecting()
        return step.endpoint if probed is None else self.connecting.plan.cut_short(probed)

    def connect_race(self) -> list[LeafUri]:
        """The endpoints to probe while the connect :meth:`connect_to` returned is
        unanswered (``probe.py``; none: just wait for it)."""
        return self.connecting.plan.race_targets()

    def connect_abandoned(self, endpoint: LeafUri, probed: LeafUri) -> LeafUri:
        """``probed`` accepted while the connect to ``endpoint`` was unanswered: that
        attempt is abandoned (a failed attempt, logged); the endpoint to open now."""
        self._check_connecting()
        return self.connecting.abandon(endpoint.address, probed, probed.address)

    def _check_connecting(self) -> None:
        if self.state is State.CLOSED:
            raise ConnectionClosed("connection closed while reconnecting")

    def connect_failed(self, address: str, error: BaseException) -> None:
        """The connect to ``address`` failed with ``error``: re-raised when another attempt
        cannot help (a refused login), else noted for the give-up error and logged
        (``warnAfterReconnectAttempts``); the driver goes on with :meth:`next_connect`."""
        self.connecting.failed(address, error)

    def connect_succeeded(self, description: str) -> None:
        """A link completed its handshake (``description``: its address, server, dialect)."""
        self.connecting.succeeded(description)

    @property
    def failed_attempts(self) -> int:
        """Connect attempts that failed since the last success."""
        return self.connecting.failed_attempts

    def startup_failed(self, error: AmqTransportError) -> list[Action[L]]:
        self._to("gave_up")
        self.error = error
        return [Notify("on_failed", error)]

    def take_backup(self, alive: Callable[[L], bool]) -> L | None:
        """A pre-connected backup link that is still alive (``backup=true``)."""
        while self.backups:
            link = self.backups.pop(0)
            if alive(link):
                return link
        return None

    def give_up_now(self, error: BaseException) -> AmqTransportError | None:
        """Before each reconnect: the error to give up with instead, if any
        (``maxReconnectAttempts=0``, or a refusal that keeps coming back)."""
        if self.options.max_reconnect_attempts == 0:
            return ReconnectExhausted(
                f"failover: link lost and maxReconnectAttempts=0, not reconnecting: {error}",
                attempts=0, last_error=error)
        frame = self.refusal
        if frame is None or self.refusal_streak < GIVE_UP_REFUSALS or self.pending or len(self.cache):
            return None
        err = error_from_frame(frame)
        return type(err)(f"failover: the broker refused the replay of {len(self.subs)} subscription(s) "
                         f"{self.refusal_streak} times in a row: {err}", frame=frame)

    def resumed(self) -> bool:
        """The reconnect installed a link and told the listeners: True when it is done,
        False when the link was lost again meanwhile (reconnect once more)."""
        if self.state is State.RECONNECTING:
            return False
        if self.state not in (State.CLOSED, State.FAILED):
            self._to("resumed")
        return True

    # -- links ----------------------------------------------------------------------------------

    def link_up(self, link: L, *, expect_gen: int | None = None) -> Install[L] | None:
        """A link completed its handshake: make it current and plan its replay. None when
        it is not installed (closed meanwhile, or a priority switch, ``expect_gen``, whose
        link changed): the returned install then only closes it."""
        if self.state is State.CLOSED:
            return Install(link, self.generation, ReplayPlan(), None, [Close(link)])
        if expect_gen is not None and (expect_gen != self.generation or self.state is not State.CONNECTED):
            return None
        self.generation += 1
        gen = self.generation
        previous, self.link = self.link, link
        self.tracking.new_link()
        stepwise = self.refusal is not None and expect_gen is None
        if stepwise and self.refusal_streak >= 2 and not self.pending and len(self.cache):
            dropped = self.cache.clear()
            log.error("failover: the broker refuses the replay again (%s): dropping %d cached "
                      "fire-and-forget send(s) of trackMessages", _error_text(self.refusal), dropped)
        plan = plan_replay(subs=self.subs, pending=self.pending.values(), txs=self.txs.open,
                           cache_frames=self.cache.frames(), gen=gen, stepwise=stepwise,
                           durable_unsubscribe=deletes_durable)
        self.txs.rolled_back(plan.rolled_back)
        for rec, _ in plan.fail:
            self.pending.pop(rec.receipt_id, None)
        for rec in plan.complete:
            self.pending.pop(rec.receipt_id, None)
        for rec in plan.batch_requests:
            rec.generation = gen
        first = next(self._write_positions)
        positions = [next(self._write_positions) for _ in plan.batch]
        for rec in plan.batch_requests:
            rec.receipt_position = first  # after the subscriptions, before any cached send
        n_cached = 0 if plan.stepwise else len(self.cache)
        self.cache.replayed(gen, positions[len(positions) - n_cached:])
        install = Install(link, gen, plan, previous)
        if n_cached:
            install.actions.append(ArmIdleTimer())
        return install

    def replay_written(self, install: Install[L], *, ok: bool, alive: bool,
                       previous_alive: bool = False) -> list[Action[L]] | None:
        """The replay batch of ``install`` was written (``ok``) or its write failed; ``alive``:
        the link is still alive now. None when the link is not installed after all (its
        write failed: the previous link stays current if ``previous_alive``)."""
        link, plan = install.link, install.plan
        if not ok:
            self.link = install.previous if install.previous is not None and previous_alive else None
            return None
        actions = list(install.actions)
        self._to("installed_stepwise" if plan.stepwise else "installed")
        self.error = None
        if not alive:
            # lost between its handshake and now (CONNECTED and the close arrived together):
            # its reader reported the loss while it was not current yet, and that report was
            # ignored. A loss right after the install; else "connected" with no reader left.
            log.info("failover: a link was lost right after its handshake (generation %d)", install.generation)
            actions += self.link_lost(link, ConnectionClosed("connection lost right after the STOMP handshake"))
        actions.extend(Settle(rec, error=err) for rec, err in plan.fail)
        actions.extend(Settle(rec, result=Frame.make("RECEIPT", {"receipt-id": rec.receipt_id}))
                       for rec in plan.complete)
        if install.previous is not None and install.previous is not link:
            actions.append(Close(install.previous))  # a priority switch: retire the previous link
        return actions

    def link_lost(self, link: L, error: BaseException) -> list[Action[L]]:
        """``link`` is gone (its reader saw the end, a write failed, heart-beats stopped)."""
        if link in self.backups:
            self.backups.remove(link)
            return []
        if link is not self.link or self.state in (State.CLOSED, State.FAILED):
            return []  # a retired link's report, or one after the end: no event
        self.link = None
        left = self._to("lost")
        self.reconnects += 1
        # only a loss while connected starts a reconnect; otherwise the running one loops
        return [Reconnect(error)] if left is State.CONNECTED else []

    def priority_wanted(self, generation: int, on_priority: bool) -> bool:
        """Should the priority probe started on link ``generation`` go on? Not once the
        transport is closed, not connected, on another link, or on a priority endpoint."""
        return (self.state is State.CONNECTED and self.generation == generation and not on_priority)

    def backup_room(self, size: int) -> bool:
        """Is there room for one more pre-connected backup (``backupPoolSize``)?"""
        return self.state is not State.CLOSED and len(self.backups) < size

    def add_backup(self, link: L) -> bool:
        """A pre-connected backup; False when closed (the driver closes it)."""
        if self.state is State.CLOSED:
            return False
        self.backups.append(link)
        return True

    # -- stepwise replay (after a refusal) ------------------------------------------------------

    def stepwise_next(self, link: L, rec: Receipt, generation: int) -> StepwiseNext[L]:
        """Write ``rec`` alone next (:class:`WriteAlone`), or :class:`Skip` it (settled
        meanwhile), or :class:`StopReplay` (the link is no longer the one replaying)."""
        if not self.still_replaying(link):
            return StopReplay()
        if self.pending.get(rec.receipt_id) is not rec:
            return Skip()
        rec.generation = generation
        rec.receipt_position = next(self._write_positions)
        return WriteAlone(Write(link, [rec.frame], generation))

    def still_replaying(self, link: L) -> bool:
        return self.link is link and self.state is State.REPLAYING

    def stepwise_blame(self, link: L, rec: Receipt, refusal: Frame | None) -> Blame:
        """``rec`` was written alone: if it is unanswered, ``link`` is no longer replaying
        and ended with ``refusal`` (an ERROR naming no request), ``rec`` is the refused
        one: :class:`Refused` with the error to fail it with (it is withdrawn).
        :class:`StopReplay`: the link was lost for another reason (replay on the next
        link). :class:`NoVerdict`: answered, or still replaying."""
        if rec.done or self.still_replaying(link):
            return NoVerdict()
        if refusal is None or self.pending.get(rec.receipt_id) is not rec:
            return StopReplay()
        del self.pending[rec.receipt_id]
        if rec.frame.command == "SUBSCRIBE":
            self.subs.pop(rec.frame.get("id") or "", None)
        self.refusal, self.refusal_streak = None, 0
        return Refused(refusal_error(refusal, rec.frame.command))

    def stepwise_done(self, link: L, install: Install[L]) -> Write[L] | None:
        """The stepwise requests are settled (or one went unanswered): write everything
        else at once and become ``connected`` (call :meth:`stepwise_connected` once
        written). None when the link is no longer the one replaying."""
        if not self.still_replaying(link):
            return None
        gen = install.generation
        frames: list[Frame] = []
        first = next(self._write_positions)
        for rec in self.pending.values():
            if rec.generation != gen:  # sent while we replayed, or left after a silence
                rec.generation, rec.receipt_position = gen, first
                frames.append(rec.frame)
        positions = [next(self._write_positions) for _ in install.plan.tail]
        self.cache.replayed(gen, positions)
        return Write(link, frames + install.plan.tail, gen)

    def stepwise_connected(self) -> None:
        self.refusal, self.refusal_streak = None, 0
        self._to("replayed")

    # -- frames from links -------------------------------------------------------------------

    def on_receipt(self, rid: str | None, generation: int) -> Receipt | None:
        """A RECEIPT on link ``generation``: the request it completes, if any (trims the cache)."""
        rec = self.pending.pop(rid, None) if rid is not None else None
        if rec is not None:
            if rec.tx is not None:
                self.txs.acked(rec.tx, generation)
            if rec.generation == generation:
                self.cache.on_receipt(generation, rec.receipt_position)
        elif rid is not None:
            self.tracking.own_receipt(rid, generation)
        return rec

    def message_is_current(self, link: L) -> bool:
        """A MESSAGE from a retired link is dropped: the broker redelivers on the current one."""
        return link is self.link

    def on_error(self, frame: Frame, *, link_error_frame: Frame | None, has_link: bool) -> bool:
        """An ERROR frame. True when it answered a receipt the transport asked for itself
        (a tracked send or a barrier: handled here). Otherwise an ERROR naming no pending
        request, on a link not yet ended by one (``link_error_frame`` None), is noted as a
        *refusal*: the next link replays stepwise. An ERROR that says the broker failed
        (a write in doubt, a broker that stopped serving) refuses nothing: the replay, with
        its keys, is what such a broker needs once it, or its slave, serves again. Nor does
        one that ends the connection for a reason of its own (``amq-connection-ended``: a
        heart-beat timeout, an operator's close): two such in a row with the same text
        (a partitioned client's "nothing received for 2.4 s", twice) once dropped the
        trackMessages cache as "refused again"."""
        rid = frame.get("receipt-id")
        if rid is not None and self.tracking.own_error(rid, frame):
            return True
        unmatched = rid is None or rid not in self.pending
        failing = any(frame.get(h) == "true" for h in (IN_DOUBT_HEADER, BROKER_STOPPED_HEADER, CONNECTION_ENDED_HEADER))
        if unmatched and has_link and link_error_frame is None and not failing:
            same = self.refusal is not None and _error_text(self.refusal) == _error_text(frame)
            self.refusal_streak = self.refusal_streak + 1 if same else 1
            self.refusal = frame
        return False

    def refused(self, rid: str) -> Receipt | None:
        """An ERROR names request ``rid``: the request it fails (withdrawn), if pending."""
        rec = self.pending.pop(rid, None)
        if rec is not None:
            self.request_refused(rec)
        return rec

    def request_refused(self, rec: Receipt) -> None:
        """``rec`` failed with its broker ERROR."""
        if rec.frame.command == "SUBSCRIBE":
            self.subs.pop(rec.frame.get("id") or "", None)

    # -- user requests ---------------------------------------------------------------------------

    def request(self, rec: Receipt) -> Write[L] | None:
        """A request asking for a receipt: pending from now on; the write when connected
        (else the next link's replay writes it)."""
        self.check_usable()
        if rec.tx is not None:
            self.txs.request(rec)
        self.pending[rec.receipt_id] = rec
        target = self.current()
        if target is None:
            return None
        link, gen = target
        rec.generation = gen
        rec.receipt_position = next(self._write_positions)
        return Write(link, [rec.frame], gen)

    def withdraw(self, rid: str) -> bool:
        """The caller stopped waiting for ``rid`` (a timeout): no longer replayed."""
        return self.pending.pop(rid, None) is not None

    # -- trackMessages (the rules: replay.Tracking) ------------------------------------------------

    def track(self, frame: Frame) -> tuple[Frame, str | None]:
        """A fire-and-forget frame about to be written (:meth:`replay.Tracking.track`)."""
        return self.tracking.track(frame)

    def untrack(self, key: str) -> None:
        """The tracked send ``key`` was called off before any write (a cancelled caller)."""
        self.cache.discard(key)

    def oneway_position(self, frame: Frame) -> int | None:
        """Position taken before writing a fire-and-forget ``frame`` (one asking for a receipt)."""
        return next(self._write_positions) if "receipt" in frame else None

    def tracked_written(self, key: str, generation: int, receipt_position: int | None) -> list[Action[L]]:
        """The tracked send ``key`` went out on link ``generation``."""
        self.tracking.written(key, generation, receipt_position)
        return self.arm_idle()

    def arm_idle(self) -> list[Action[L]]:
        """Ask for the idle timer while the cache holds sends."""
        return [ArmIdleTimer()] if self.state is not State.CLOSED and len(self.cache) else []

    def barrier(self) -> tuple[Write[L], str] | None:
        """The idle timer fired: the barrier to write (an empty transaction whose ABORT asks
        for a receipt that trims the cache) and its receipt id, or None when not needed."""
        if self.state not in LINK_UP or self.link is None or not len(self.cache):
            return None
        frames, rid = self.tracking.barrier()
        return Write(self.link, frames, self.generation), rid

    def barrier_written(self, rid: str, generation: int) -> None:
        if generation != self.generation:
            self.tracking.barrier_stale(rid)

    def subscribe(self, sub_id: str, frame: Frame) -> None:
        self.check_usable()
        self.subs[sub_id] = frame.without_headers("receipt")

    def unsubscribe(self, sub_id: str) -> bool:
        """Forget ``sub_id``; False when the transport is over (nothing to write)."""
        self.subs.pop(sub_id, None)
        return self.state not in (State.FAILED, State.CLOSED)

    # -- transactions (the rules: replay.Transactions) ---------------------------------------------

    def begin(self, tx_id: str) -> None:
        self.check_usable()
        self.txs.begin(tx_id)

    def commit(self, tx_id: str) -> None:
        """Raise :class:`TransactionRolledBack` when the broker lost the transaction."""
        self.txs.commit(tx_id, self.generation)

    def tx_done(self, tx_id: str) -> None:
        self.txs.done(tx_id)

    def abort(self, tx_id: str) -> Write[L] | None:
        """The ABORT to write, or None when the broker already dropped it with a dead link."""
        target = self.current()
        if not self.txs.abort(tx_id, self.generation) or target is None:
            return None
        link, gen = target
        return Write(link, [Frame.make("ABORT", {"transaction": tx_id})], gen)
