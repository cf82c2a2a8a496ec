"""The asyncio failover driver: ``failover:(...)`` on an event loop, over the same
sans-IO core as the thread driver.

Theory of operation
-------------------
Every failover rule lives in :class:`~amqtransport.transports.core.FailoverCore` (its
docstring lists them); the thread driver (``transports/failover.py``) and this one only
run it. Here everything happens on one event loop, so the core needs no lock: each
event is one synchronous call, and its actions are carried out before the next await.

*Links.* :class:`~amqtransport.transports.aio_link.AsyncLink` is one STOMP link on an
asyncio transport (its protocol reports each frame, in the loop turn that read it, and
the loss to the driver; its ``write`` puts whole frames in the buffer, so a cancelled
caller never leaves half a frame on the stream). The driver takes a link opener
(``open_link``) as its seam.

*Reconnecting.* A loss the core answers with ``Reconnect`` starts one supervisor task:
it tells the listeners ``on_interrupted``, walks the core's connect steps, waits each
step's delay through :class:`~amqtransport.transports.probe.ProbingWait` (the same rule
as the thread driver, here with ``await asyncio.sleep`` and an asyncio TCP probe),
runs each open beside a probe of the endpoints the core names
(``core.connect_race``: those that refused in this reconnect) and abandons an open still
unanswered when one of them accepts (``core.connect_abandoned``), installs the first
link that completes its handshake and writes its replay at once
(no await between the core's ``link_up`` and the write: nothing overtakes the replay),
then tells the listeners ``on_resumed``. The trackMessages idle barrier is a
``loop.call_later`` timer.

*Waiting.* Requests are :class:`~amqtransport.transports.base.Receipt` objects as in the
thread driver; ``wait`` awaits a future the driver resolves when the core settles the
request. ``timeout`` (ms) bounds the time a caller waits while disconnected, as in the
thread driver. Listeners may be plain or ``async`` callables.

``priorityBackup`` runs as a task that probes the priority endpoints while connected
elsewhere, and ``backup`` as a task that fills the pre-connected pool, with the same
rules as the thread driver (the core's ``priority_wanted``/``backup_room``,
``endpoints.priority_attempts``); both tasks are in ``failover_backup.py``. ``vm://``
leaves start the in-process broker, as in the thread driver.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import random
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

from amqtransport._backends.base import leaf_address
from amqtransport.aio.failover_backup import AsyncBackupLinks
from amqtransport.backoff import Attempt, failed_last, failover_schedule
from amqtransport.errors import (
    AmqTransportError,
    AuthenticationError,
    ConnectionClosed,
    ReconnectExhausted,
    SendTimeout,
    TransportError,
)
from amqtransport.options import FailoverOptions
from amqtransport.stomp import Frame
from amqtransport.tasks import cancel_and_wait
from amqtransport.transports.aio_link import (
    AsyncLink,
    FrameHandler,
    LostHandler,
    async_tcp_probe,
    open_stream_link,
)
from amqtransport.transports.base import Receipt, request_error, with_receipt
from amqtransport.transports.core import (
    STEPWISE_WAIT,
    UNEXPECTED_PAUSE,
    Action,
    ArmIdleTimer,
    Close,
    FailoverCore,
    Install,
    Notify,
    Reconnect,
    Settle,
    Write,
)
from amqtransport.transports.core_actions import Refused, Skip, StopReplay
from amqtransport.transports.core_view import CoreStatus
from amqtransport.transports.endpoints import endpoints
from amqtransport.transports.factory import failover_spec
from amqtransport.transports.link import ConnectParams, connect_timeout_for
from amqtransport.transports.probe import ProbingWait
from amqtransport.transports.waiting import ReceiptWait, send_timeout
from amqtransport.uri import LeafUri

__all__ = ["AsyncFailoverTransport", "LinkOpener"]

log = logging.getLogger(__name__)

#: ``open_link(leaf, params, on_frame, on_lost)``: a link whose handshake is done
LinkOpener = Callable[[LeafUri, ConnectParams, FrameHandler, LostHandler], Awaitable[AsyncLink]]
AsyncProbe = Callable[[LeafUri, float], Awaitable[bool]]
ScheduleFn = Callable[..., Iterator[Attempt[LeafUri]]]


Listener = object


class AsyncFailoverTransport(CoreStatus[AsyncLink], AsyncBackupLinks):
    """``failover:(u1,u2,...)?options`` on an event loop (see the module docstring)."""

    def __init__(
        self,
        leaves: Sequence[LeafUri],
        options: FailoverOptions,
        params: ConnectParams = ConnectParams(),  # noqa: B008 - frozen
        *,
        open_link: LinkOpener = open_stream_link,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        rng: random.Random | None = None,
        schedule: ScheduleFn = failover_schedule,
        probe: AsyncProbe | None = async_tcp_probe,
    ) -> None:
        if not leaves:
            raise ValueError("failover needs at least one endpoint")
        self.leaves = list(leaves)
        self.options = options
        self._params = params
        self._open_link = open_link
        self._sleep = sleep
        self._rng = rng
        self._schedule = schedule
        self._probe = probe
        self._ids = 0
        self._core: FailoverCore[AsyncLink] = FailoverCore(options, self.next_id)
        self._listeners: list[Listener] = []
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}  # receipt id -> each waiting call's future
        self._changed = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._idle: asyncio.TimerHandle | None = None
        self._probing = False
        #: the address of the link lost last: a reconnect tries it last (``backoff.failed_last``)
        self._failed_address: str | None = None
        #: a ``failover:`` schedule tries the lost broker last; ``static:`` / ``masterslave:``
        #: keep their order (ActiveMQ builds a new failover transport for each of their passes)
        self._lost_last = schedule is failover_schedule
        #: ``on_message(frame, generation)`` for every MESSAGE of the current link
        self.on_message: Callable[[Frame, int], None] | None = None
        #: called with each ERROR that names no request (before the link ends)
        self.on_broker_error: Callable[[Frame], None] | None = None

    @classmethod
    def from_uri(cls, uri: str, params: ConnectParams = ConnectParams()) -> AsyncFailoverTransport:  # noqa: B008
        """The (not yet started) driver for ``uri`` (``failover:``, ``static:``,
        ``masterslave:`` or one leaf, as the thread client reads them)."""
        spec = failover_spec(uri)
        return cls(spec.leaves, spec.options, params, schedule=spec.schedule or failover_schedule)

    # -- state -------------------------------------------------------------------------

    def next_id(self, prefix: str) -> str:
        self._ids += 1
        return f"{prefix}-{self._ids}"

    def add_listener(self, listener: Listener) -> None:
        """An object with any of ``on_interrupted``, ``on_resumed``, ``on_failed`` (plain or async)."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    # -- carrying out the core's actions ----------------------------------------------------

    def _run(self, actions: Sequence[Action[AsyncLink]]) -> None:
        for action in actions:
            if isinstance(action, Settle):
                self._settle(action.request, action.result, action.error)
            elif isinstance(action, Write):
                self._write(action)
            elif isinstance(action, Close):
                action.link.close(disconnect=action.disconnect)
            elif isinstance(action, Notify):
                self._notify(action.event, action.arg)
            elif isinstance(action, Reconnect):
                self._spawn(self._supervise(action.error), "amq-aio-failover-supervisor")
            elif isinstance(action, ArmIdleTimer):
                if self._idle is None and not self._core.closed:
                    self._idle = asyncio.get_running_loop().call_later(action.delay, self._idle_barrier)
        self._kick()

    def _kick(self) -> None:
        """Wake whoever waits for a state change."""
        self._changed.set()
        self._changed = asyncio.Event()

    def _settle(self, rec: Receipt, result: Frame | None = None, error: BaseException | None = None) -> None:
        if error is not None:
            rec.set_error(error)
        elif result is not None:
            rec.set_result(result)
        for waiter in self._waiters.pop(rec.receipt_id, ()):
            if not waiter.done():
                waiter.set_result(None)

    @staticmethod
    def _write(action: Write[AsyncLink]) -> bool:
        try:
            action.link.write(action.frames)
            return True
        except TransportError as exc:
            action.link.kill(exc)
            return False

    def _spawn(self, coro: Awaitable[None], name: str) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _notify(self, event: str, arg: object) -> None:
        for listener in list(self._listeners):
            fn = getattr(listener, event, None)
            if fn is None:
                continue
            try:
                result = fn(arg)
            except Exception:
                log.exception("listener %r.%s raised; ignored", listener, event)
                continue
            if inspect.isawaitable(result):
                # the listener's own coroutine is the task: cancelled by close() before its first
                # step it is closed, never left un-awaited (a wrapper's would be)
                coro = result if inspect.iscoroutine(result) else _awaited(result)
                task: asyncio.Task[object] = asyncio.ensure_future(coro)
                task.set_name(f"amq-aio-listener {event}")
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                task.add_done_callback(functools.partial(_log_failure, f"listener {listener!r}.{event}"))

    def _idle_barrier(self) -> None:
        self._idle = None
        barrier = self._core.barrier()
        if barrier is not None:
            write, rid = barrier
            self._write(write)
            self._core.barrier_written(rid, write.generation)

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        self._core.start()
        while True:
            try:
                link = await self._connect_loop(startup=True, last_error=None)
            except (ReconnectExhausted, AuthenticationError) as exc:
                self._run(self._core.startup_failed(exc))
                raise
            if self._install(link) is not None:
                self._after_connect()
                return

    async def close(self) -> None:
        if self._core.closed:
            return
        actions = self._core.close()
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        self._run(actions)
        current = asyncio.current_task()
        await cancel_and_wait(*(t for t in self._tasks if t is not current and not t.done()))

    # -- connecting ---------------------------------------------------------------------

    async def _connect_loop(self, *, startup: bool, last_error: BaseException | None) -> AsyncLink:
        """Walk the core's connect steps until one link completes its handshake (the
        policy is the core's: this waits and connects)."""
        backup = self._core.take_backup(lambda link: link.alive)
        if backup is not None:
            log.info("failover: using pre-connected backup %s", backup.address)
            return backup
        leaves = self.leaves
        if self.options.update_uris_url:  # may read a URL: off the loop
            leaves = await asyncio.to_thread(endpoints, self.leaves, self.options.update_uris_url)
        attempts = self._schedule(leaves, self.options, startup=startup, rng=self._rng)
        self._core.begin_connect(leaves, failed_last(attempts, self._failed_address if self._lost_last and not startup else None),
                                 startup=startup, last_error=last_error)
        every = self.options.probe_interval / 1000.0
        loop = asyncio.get_running_loop()
        while True:
            step = self._core.next_connect()
            probed = None
            if step.delay > 0:
                wait = ProbingWait(step.delay, leaves, probing=step.probe and self._probe is not None,
                                   every=every, clock=loop.time)
                probed = await self._wait_probing(wait, every)
                if probed is not None:
                    log.info("failover: %s accepts connections: connecting now", leaf_address(probed))
            endpoint = self._core.connect_to(step, probed)
            link: AsyncLink | None = None
            while link is None:
                try:
                    link, won = await self._open_racing(endpoint, self._core.connect_race(), every)
                except AmqTransportError as exc:
                    self._core.connect_failed(leaf_address(endpoint), exc)
                    break
                if won is not None:  # a probe saw a refusing endpoint accept: go there now
                    endpoint = self._core.connect_abandoned(endpoint, won)
            if link is None:
                continue
            server = link.connected_frame.get("server") if link.connected_frame is not None else None
            self._core.connect_succeeded(f"{link.address} ({server or 'no server header'}, "
                                         f"dialect {link.dialect.name})")
            return link

    async def _open_racing(self, leaf: LeafUri, race: list[LeafUri],
                           every: float) -> tuple[AsyncLink | None, LeafUri | None]:
        """Open ``leaf``; while it is unanswered, probe ``race`` (``probe.py``): the link,
        or (None, the endpoint that accepted) when a probe won and cancelled the open.
        The open is awaited in this task (a link's first frames are handed on in the loop
        turn after its open: the driver must have it by then); the probe is a task that
        cancels this one when it wins."""
        if not race or self._probe is None:
            return await self._open_link(leaf, self._params, self._on_frame, self._lost), None
        me = asyncio.current_task()
        assert me is not None
        won: list[LeafUri] = []
        opening = True

        async def probe() -> None:
            wait = ProbingWait(connect_timeout_for(leaf, self._params), race, probing=True, every=every,
                               clock=asyncio.get_running_loop().time)
            endpoint = await self._wait_probing(wait, every)
            if endpoint is not None and opening:
                won.append(endpoint)
                me.cancel()

        probing = asyncio.ensure_future(probe())
        try:
            return await self._open_link(leaf, self._params, self._on_frame, self._lost), None
        except asyncio.CancelledError:
            if won and me.uncancel() == 0:  # our probe's cancel, not a close()
                return None, won[0]
            raise
        finally:
            opening = False
            probing.cancel()

    async def _wait_probing(self, wait: ProbingWait[LeafUri], every: float) -> LeafUri | None:
        while (step := wait.next_sleep()) is not None:
            await self._sleep(step)
            for endpoint in wait.slept(step):
                if self._probe is not None and await self._probe(endpoint, every):
                    return endpoint
        return None

    def _install(self, link: AsyncLink, *, expect_gen: int | None = None) -> Install[AsyncLink] | None:
        """Make ``link`` current and write its replay before anything else (no await);
        ``expect_gen`` (priority switch): only if the current link is still that one."""
        install = self._core.link_up(link, expect_gen=expect_gen)
        if install is None:
            link.close()
            return None
        if self._core.closed:
            self._run(install.actions)
            return install
        link.tag = install.generation
        try:
            link.write(install.plan.batch)
            ok = True
        except TransportError as exc:
            log.info("failover: %s died during replay: %s", link.address, exc)
            ok = False
        previous = install.previous
        actions = self._core.replay_written(install, ok=ok, alive=link.alive,
                                            previous_alive=previous is not None and previous.alive)
        if actions is None:
            link.close(disconnect=False)
            return None
        if install.plan.batch:
            log.info("failover: replayed %d frame(s) on %s", len(install.plan.batch), link.address)
        self._run(actions)
        return install

    def _lost(self, link: AsyncLink, error: TransportError) -> None:
        actions = self._core.link_lost(link, error)
        if any(isinstance(action, Reconnect) for action in actions):
            self._failed_address = link.address
        self._run(actions)

    async def _supervise(self, error: BaseException) -> None:
        log.warning("failover: link lost (%s); reconnecting", error)
        self._notify("on_interrupted", error)
        while True:
            hopeless = self._core.give_up_now(error)
            if hopeless is not None:
                self._fail(hopeless)
                return
            try:
                link = await self._connect_loop(startup=False, last_error=error)
            except ConnectionClosed:  # closed meanwhile
                return
            except (ReconnectExhausted, AuthenticationError) as exc:
                self._fail(exc)
                return
            except Exception:  # a bug: log it, and never let it end the reconnecting for good
                log.exception("failover: reconnecting failed unexpectedly; trying again in %.2fs", UNEXPECTED_PAUSE)
                await asyncio.sleep(UNEXPECTED_PAUSE)
                if self._core.closed:
                    return
                continue
            install = self._install(link)
            if install is None:
                continue
            if install.plan.stepwise and not await self._replay_stepwise(link, install):
                continue
            self._notify("on_resumed", link.address)
            if self._core.resumed():
                self._after_connect()
                return

    def _fail(self, error: AmqTransportError) -> None:
        actions = self._core.fail(error)
        if actions:
            log.error("failover: giving up: %s", error)
        self._run(actions)

    async def _replay_stepwise(self, link: AsyncLink, install: Install[AsyncLink]) -> bool:
        """After a refusal: the stepwise requests one at a time (``replay.py``)."""
        for rec in install.plan.stepwise:
            step = self._core.stepwise_next(link, rec, install.generation)
            if isinstance(step, StopReplay):
                return False
            if isinstance(step, Skip):
                continue
            if self._write(step.write) and not (rec.tx is not None and rec.frame.command == "SEND"):
                await self._await_receipt(rec, STEPWISE_WAIT, stop=lambda: not self._core.still_replaying(link))
            blamed = self._core.stepwise_blame(link, rec, link.error_frame)
            if isinstance(blamed, StopReplay):
                return False
            if isinstance(blamed, Refused):
                log.error("failover: the broker refuses a %s: %s", rec.frame.command, blamed.error)
                self._settle(rec, error=blamed.error)
                return False
            if not rec.done:
                break
        rest = self._core.stepwise_done(link, install)
        if rest is None:
            return False
        self._run(self._core.arm_idle())
        if not self._write(rest):
            return False
        self._core.stepwise_connected()
        self._kick()
        return True

    # -- frames -----------------------------------------------------------------------

    def _on_frame(self, link: AsyncLink, frame: Frame) -> None:
        command = frame.command
        if command == "RECEIPT":
            rec = self._core.on_receipt(frame.get("receipt-id"), link.tag)
            if rec is not None:
                self._settle(rec, result=frame)
        elif command == "MESSAGE":
            if self._core.message_is_current(link) and self.on_message is not None:
                self.on_message(frame, link.tag)
        elif command == "ERROR":
            if self._core.on_error(frame, link_error_frame=link.error_frame, has_link=True):
                return
            rid = frame.get("receipt-id")
            rec = self._core.refused(rid) if rid is not None else None
            if rec is not None:
                self._settle(rec, error=request_error(rec, frame))
                return
            log.warning("broker ERROR (not tied to a request; ending the link): %s", frame.get("message"))
            if self.on_broker_error is not None:
                self.on_broker_error(frame)
            link.end_with_error(frame)

    # -- requests --------------------------------------------------------------------------

    async def _until_settled(self, rec: Receipt, timeout: float | None) -> None:
        """Wait until ``rec`` is settled, at most ``timeout`` s (None: no limit). The
        caller's own future, awaited directly: the settling wakes this task in the next
        loop turn (``asyncio.wait`` took two), and a wait given up on (a timeout, a
        cancellation) cancels no one else's."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters = self._waiters.setdefault(rec.receipt_id, [])
        waiters.append(waiter)
        try:
            if timeout is None:
                await waiter
            else:
                try:
                    async with asyncio.timeout(timeout):
                        await waiter
                except TimeoutError:
                    pass
        finally:
            if waiter in waiters:
                waiters.remove(waiter)
                if not waiters and self._waiters.get(rec.receipt_id) is waiters:
                    del self._waiters[rec.receipt_id]

    async def _await_receipt(self, rec: Receipt, timeout: float, stop: Callable[[], bool]) -> None:
        """Wait up to ``timeout`` s for ``rec``'s outcome, or until ``stop()``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not rec.done and not stop() and loop.time() < deadline:
            await self._until_settled(rec, 0.05)

    async def _wait_connected(self, started: float) -> tuple[AsyncLink, int]:
        timeout_ms = self.options.timeout
        loop = asyncio.get_running_loop()
        while True:
            self._core.check_usable()
            target = self._core.current()
            if target is not None:
                return target
            remaining = None if timeout_ms < 0 else timeout_ms / 1000.0 - (loop.time() - started)
            if remaining is not None and remaining <= 0:
                raise send_timeout(f"failover: not connected within timeout={timeout_ms} ms")
            changed = self._changed
            try:
                async with asyncio.timeout(remaining):
                    await changed.wait()
            except TimeoutError:
                pass

    async def request(self, frame: Frame, *, receipt: bool = True) -> Receipt | None:
        """Write ``frame``; with ``receipt`` the request (await :meth:`wait`), replayed on
        each new link until answered. Without: written once a link is up."""
        if not receipt:
            await self._oneway(frame)
            return None
        rid = self.next_id("r")
        rec = Receipt(rid, with_receipt(frame, rid), tx=frame.get("transaction"))
        write = self._core.request(rec)
        if write is not None and self._write(write) and write.link.paused:
            await write.link.drain()
        return rec

    async def _oneway(self, frame: Frame) -> None:
        started = asyncio.get_running_loop().time()
        frame, key = self._core.track(frame)
        while True:
            try:
                link, gen = await self._wait_connected(started)
            except SendTimeout as exc:
                raise send_timeout(str(exc), frame=frame) from None
            except asyncio.CancelledError:
                if key is not None:
                    self._core.untrack(key)  # cancelled before any write: not sent at all, not replayed
                raise
            receipt_position = self._core.oneway_position(frame)
            if not self._write(Write(link, [frame], gen)):
                if key is not None:
                    return  # in the cache: replayed on the next link
                continue
            if key is not None:
                self._run(self._core.tracked_written(key, gen, receipt_position))
            await link.drain()
            return

    async def wait(self, receipt: Receipt, timeout: float | None = None) -> Frame:
        """The broker's RECEIPT for ``receipt``; raises its error, or ``SendTimeout``."""
        if timeout is None and self.options.timeout < 0 and not receipt.done:
            await self._until_settled(receipt, None)  # no deadline of any kind: until settled
        loop = asyncio.get_running_loop()
        rule = ReceiptWait(self.options.timeout, timeout, loop.time())
        while not receipt.done:
            await self._until_settled(receipt, rule.slice)
            if receipt.done:
                break
            verdict = rule.verdict(loop.time(), self.is_connected)
            if verdict == "deadline":
                self._core.withdraw(receipt.receipt_id)
                raise send_timeout(f"no receipt for {receipt.receipt_id} within {timeout}s", receipt)
            if verdict == "disconnected" and self._core.withdraw(receipt.receipt_id):
                raise send_timeout(f"failover: disconnected for longer than timeout={self.options.timeout} ms "
                                   f"while waiting for receipt {receipt.receipt_id}", receipt)
        if receipt.error is not None:
            raise receipt.error
        assert receipt.result is not None
        return receipt.result

    def write_if_current(self, frame: Frame, generation: int) -> bool:
        """Write ``frame`` (an ACK/NACK) only on link ``generation``; False when stale."""
        return self.write_many_if_current([frame], generation)

    def write_many_if_current(self, frames: list[Frame], generation: int) -> bool:
        link = self._core.link_of(generation)
        return link is not None and self._write(Write(link, frames, generation))

    async def subscribe(self, sub_id: str, frame: Frame) -> Receipt:
        self._core.subscribe(sub_id, frame)
        rec = await self.request(frame)
        assert rec is not None
        return rec

    async def unsubscribe(self, sub_id: str, frame: Frame) -> Receipt | None:
        if not self._core.unsubscribe(sub_id):
            return None
        return await self.request(frame)

    async def begin(self, tx_id: str) -> Receipt:
        self._core.begin(tx_id)
        rec = await self.request(Frame.make("BEGIN", {"transaction": tx_id}))
        assert rec is not None
        return rec

    async def commit(self, tx_id: str) -> Receipt:
        self._core.commit(tx_id)
        rec = await self.request(Frame.make("COMMIT", {"transaction": tx_id}))
        assert rec is not None
        return rec

    def tx_done(self, tx_id: str) -> None:
        self._core.tx_done(tx_id)

    def abort(self, tx_id: str) -> None:
        write = self._core.abort(tx_id)
        if write is not None:
            self._write(write)


async def _awaited(awaitable: Awaitable[object]) -> object:
    return await awaitable


def _log_failure(what: str, task: asyncio.Task[object]) -> None:
    if not task.cancelled() and isinstance(task.exception(), Exception):
        log.error("%s raised; ignored", what, exc_info=task.exception())
