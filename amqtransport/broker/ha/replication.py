"""Replication between the two nodes of a shared-nothing pair.

Theory of operation
-------------------
The link. A slave opens a TCP connection to the master (its ``--master-connector``:
the master's client port or its HA port) and sends a STOMP ``CONNECT`` frame with
``amq-ha-replica:<slave name>``, its epoch and its own addresses, plus ``login`` /
``passcode`` when the master has users (the master checks them exactly like a client
login and refuses with an ``ERROR`` frame and a log line naming the link). The master
answers ``CONNECTED`` with its role, epoch and addresses; from then on both sides
speak a small binary protocol on the same socket::

    u8 kind | u32 length | payload

``SNAP`` and ``RECORDS`` carry journal record payloads (``u64 first_seq`` then
``u32 len | bytes`` each -- exactly the bytes the master's journal wrote; at most
:data:`.wire.FRAME_BYTES` of records per frame, a bigger single record alone, so no frame
exceeds a journal record plus 12 bytes and the receiver can bound what it buffers), ``SYNC_END``
closes the snapshot and names the sequence number it covers, ``ACK`` (slave ->
master) names the highest sequence number durable on the slave's disk, ``PING`` keeps
a quiet link provably alive, ``BYE`` announces a clean slave shutdown, ``HANDOVER``
(master -> slave, the last frame of a link) a master leaving its role on purpose: a
request signed with the cluster secret, answering the challenge the slave gave in its
``CONNECT``, after which the in-sync slave takes over at once (:meth:`ReplicationMaster.close`;
:mod:`.decide`, "Handovers").

Full sync, then every record. On attach the master, in one step on its event loop,
notes ``base`` = records written so far and takes a :class:`~..store.sync.SnapshotReader`
of its store at that journal position (subscriptions, dedupe keys, and the journal
position of every live message: a few bytes each). Then, one bounded step per loop turn
and only while the socket takes it (``pause_writing``), it sends the snapshot as SNAP
frames, the messages read back from its journal; ``SYNC_END``; then the records
appended since ``base``, read back from its journal (:class:`~..store.sync.TailReader`,
numbered ``base+1, ...``) until that reader has caught up with what the store listener
keeps from the moment it first caught up; from then on every record goes to the slave
as it is appended. Memory stays bounded on both sides whatever the store's size, the
master serves its clients throughout, and compaction deletes no segment until the
readers are done. Nothing can slip between the snapshot and the stream: the snapshot
and ``base`` are taken in one loop step, and the tail is the journal itself. The slave
wipes its store, imports the snapshot (its messages paged: a replica holds positions,
not bodies), fsyncs, marks itself synced at the master's epoch and acks ``base``; then
it appends every streamed batch to its own journal and acks once it is fsynced, before
it applies the batch to its in-memory state (:mod:`.slave_link`: the ACK means "on the
slave's disk", and the journal, not the state, is what a takeover or a restart serves).

The receipt gate. Receipts are sent from the journal's completion callbacks, which
the journal hands to its ``notify`` function after each local fsync -- all of them: a
frame that wrote no record (SUBSCRIBE, BEGIN, ABORT, a non-persistent SEND) is receipted
through ``Journal.on_durable`` (:meth:`~..dispatch.registry.Registry.done`), so one gate and one
stall check cover every RECEIPT. The
:class:`ReplicationMaster` takes that function's place: its batch hook numbers the
batch (the last sequence number in it) and the completions are queued on the event
loop until the slave's ``ACK`` covers that number; acks arrive on the loop and release
them in order. So *a receipt means the record is on both disks*, and nothing blocks:
the master's writer goes on fsyncing the next batch while the slave works (the journal
pipeline is not stalled by the network), and records are streamed to the slave as soon
as they are appended, before the master's own fsync, so the two fsyncs overlap. A turn
that appended a few records the loop commits itself at its end, as a broker alone does
(``Journal.commit_turn``); their completions come to the gate through
``Journal.deliver_here`` instead of ``notify``, and wait there alike. A slave
in sync that leaves a batch unacknowledged for ``link_timeout`` is dropped. Completions
held for a synced slave that is lost without a goodbye are *never* run as successes:
that slave may be taking over without those records. Every client connection is cut
first (:meth:`BrokerServer.abort_connections`: the clients replay to whichever node is
master, and idempotency keys drop the copies), then they run with an error nobody
sees (a :class:`~..store.NotReceipted` when the node goes on as master: the records are
on its disk, and a new scheduled job waits again for them to count). The master is then *suspect* (:attr:`ReplicationMaster.suspect`, also set when
its own loop stalled for longer than ``link_timeout``; :meth:`~ReplicationMaster.check_stall`
runs on a timer and also before a client CONNECT or a completion is acted on, since a
loop thawed in mid-turn reads its sockets before its overdue timers): no completion runs unless a
slave ack covers it, until the node has asked its peer to stand by
(:mod:`.decide`, phase ``master``) and calls :meth:`clear_suspect` -- or steps down. With a
witness (:mod:`.witness`) the node may clear it on the witness's lease instead: then
:attr:`~ReplicationMaster.lease_until` bounds it, and with no slave attached the master is
suspect again the moment that lease runs out unrenewed (checked where a stall is). With
``--shutdown-on-slave-failure`` the node stops instead. A slave lost during its full
sync, before ``SYNC_END`` went out, or one that said goodbye, releases what waited for
it (it cannot take over). Once ``SYNC_END`` is written the slave counts as synced when it
is lost, ack or not: it marks its copy complete (one that may take over) as soon as
``SYNC_END`` is durable on its disk, before its ack can reach us, so a link lost in
between must not let us receipt alone before it has stood by (found by the nemesis
without a witness: a master isolated right after its slave re-linked receipted alone once
the partition healed, froze, and the slave took over without those receipts).
During the full sync there is no deadline: ActiveMQ's rule, a master does not
answer a client until the event is forwarded, and a slave that has not finished its
sync cannot take over anyway. (``Journal.on_durable`` with nothing queued completes at
once on the loop: such a completion waits for the slave to have every record so far.)

Every numbered record counts: the master's listener counts from the journal's
append counter at install time, and the batch hook counts ``records_written`` of the
journal, so both number exactly the payloads that went through the store.

The wire format and the asking side of every HA request are in :mod:`.wire`; this
module is the master's side (:class:`ReplicationMaster`; one slave connection's end is
:class:`~.master_link.MasterLink`), and
:mod:`.slave` the slave's (:class:`~.slave.SlaveLink`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from ..store import RECEIPT_PATH, Callback, JournalError, NotReceipted, Record, run_completions
from ..store.sync import SnapshotReader
from .master_link import MasterLink

if TYPE_CHECKING:
    from ..server import BrokerServer

__all__ = ["ReplicationMaster", "MasterLink"]

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------- master side
class ReplicationMaster:
    """Master half: store listener + receipt gate + the attached slave link (at most one)."""

    def __init__(
        self,
        server: BrokerServer,
        *,
        link_timeout: float,
        shutdown_on_slave_failure: bool,
        on_synced: Callable[[MasterLink], None],
        on_lost: Callable[[MasterLink, str, bool], None],
        on_suspect: Callable[[str], None] = lambda _reason: None,
        on_clear: Callable[[str], None] = lambda _reason: None,
    ) -> None:
        assert server.store is not None
        self.server = server
        self.store = server.store
        self.loop = server.loop
        self.link_timeout = link_timeout
        self.shutdown_on_slave_failure = shutdown_on_slave_failure
        self.on_synced = on_synced
        self.on_lost = on_lost
        self.on_suspect = on_suspect
        self.on_clear = on_clear
        #: why receipts not covered by a slave ack are held (None: they are not); see decide.py, phase master
        self.suspect: str | None = None
        self.suspect_since = 0.0  # loop time the receipts began to be held (decide.py: the refusal window)
        #: receipting with no slave attached needs the witness's lease until this loop time
        #: (None: it needs none); set by clear_suspect, renewed by the node (witness.py)
        self.lease_until: float | None = None
        self.refused_receipts = 0  # completions never run as successes (their clients were cut off)
        self._refused_logged = float("-inf")
        journal = self.store.journal
        with journal._cond:  # noqa: SLF001 - the append counter numbers the stream
            self.seq = journal._appended  # noqa: SLF001
        self._loop_thread = threading.get_ident()
        self._batch_target = 0  # writer thread: last record number of the batch being completed
        self._acked = 0
        self._gated: MasterLink | None = None
        self._fatal: str | None = None
        self._closed = False
        self._held: deque[tuple[int, float, list[tuple[Callback, BaseException | None]]]] = deque()
        self.link: MasterLink | None = None
        self.gate_timeouts = 0
        self.held_max = 0
        # replication lag in bytes (metrics): payload bytes numbered so far, and marks
        # (seq, bytes so far) taken once per loop turn while a slave is attached
        self.streamed_bytes = 0
        self._acked_bytes = 0
        self._marks: deque[tuple[int, int]] = deque()
        self._mark_due = False
        self.store.add_listener(self)
        journal.add_batch_hook(self._hook)
        self._orig_notify = journal._notify  # noqa: SLF001
        journal._notify = self._notify  # noqa: SLF001 - completions pass through the gate
        self._orig_deliver_here = journal.deliver_here
        # a batch the loop committed at the end of a turn (Journal.commit_turn, as on a broker
        # alone: a lone receipted send needs no writer wake-up and no hand-off back) waits
        # for the slave as one from the writer thread does; the record went to the slave
        # when it was appended, before that commit (BENCHMARKS.md, "The slave acks first, the
        # master commits on its loop")
        journal.deliver_here = self._deliver_here
        self._tick_due = self.loop.time() + self._tick_every
        self._timer: asyncio.TimerHandle | None = self.loop.call_at(self._tick_due, self._tick)

    @property
    def _tick_every(self) -> float:
        return max(0.02, self.link_timeout / 4)

    def close(self, handover: bytes | None = None) -> None:
        """Stop replicating: nothing more is receipted. With ``handover`` (a signed
        ``HANDOVER`` frame, :func:`.wire.pack_handover`) and an in-sync slave attached, the
        link ends with it, after every record streamed so far (the slave takes over at
        once); else the link is cut."""
        journal = self.store.journal
        self.store.remove_listener(self)
        journal.remove_batch_hook(self._hook)
        journal._notify = self._orig_notify  # noqa: SLF001
        journal.deliver_here = self._orig_deliver_here
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        # completions still waiting for the slave are dropped, never run: the master is
        # stopping, its clients are about to be cut off, and a receipt now could claim a
        # copy the slave (which may take over) does not have
        self._held.clear()
        self._fatal = "master stopping"
        self._closed = True
        link, self.link = self.link, None
        self._gated = None
        if link is not None:
            if handover is not None and link.synced:
                link.hand_over(handover)
            else:
                link.abort("master stopping")

    # writer thread -----------------------------------------------------
    def _hook(self, payloads: Sequence[bytes]) -> None:
        """Called by the journal writer after each local fsync: number the batch."""
        self._batch_target = self.store.journal.records_written + len(payloads)
        return None

    def _notify(self, items: list[tuple[Callback, BaseException | None]]) -> None:
        """Replaces the journal's ``notify``: completions wait on the loop for the slave."""
        if threading.get_ident() == self._loop_thread:
            if any(err is not None for _cb, err in items):
                # a batch that failed on the loop (Journal.commit_turn): like one that failed
                # on the writer thread, it waits for the batches numbered before it only
                self._hold(self._batch_target, items)
                return
            # Journal.on_durable with nothing queued: all appended records are on our
            # disk; the caller must still wait for the slave to have them all
            self._hold(self.seq, items)
            return
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self._hold, self._batch_target, items, time.perf_counter())

    # loop thread -------------------------------------------------------
    def _deliver_here(self, items: list[tuple[Callback, BaseException | None]]) -> None:
        """The journal's ``deliver_here``: a batch the loop committed itself
        (``Journal.commit_turn``; its batch hook numbered it on this thread) waits for the
        slave's ack of it, as one from the writer thread does."""
        self._hold(self._batch_target, items)

    def _may_run(self, target: int) -> bool:
        """May completions up to record ``target`` run? With a slave attached, when it has
        acked them; without one, unless we are suspect (see decide.py, phase master)."""
        if self._gated is not None:
            return self._acked >= target
        return self.suspect is None

    def _hold(self, target: int, items: list[tuple[Callback, BaseException | None]],
              handed_at: float | None = None) -> None:
        if handed_at is not None:
            RECEIPT_PATH.handoff.observe(time.perf_counter() - handed_at)
        if self._closed:
            run_completions([(cb, err or JournalError("master stopping")) for cb, err in items])
            return
        if self._fatal is not None:
            self._refuse([items], self._fatal)
            return
        self.check_stall()
        if not self._held and self._may_run(target):
            if self._gated is not None:
                RECEIPT_PATH.gate_wait.observe(0.0)  # the slave's ack came first
            self._run(items, self.loop.time())
            return
        self._held.append((target, self.loop.time(), items))
        self.held_max = max(self.held_max, len(self._held))

    def _release(self) -> None:
        held = self._held
        while held and self._may_run(held[0][0]):
            _, since, items = held.popleft()
            RECEIPT_PATH.gate_wait.observe(self.loop.time() - since)
            self._run(items, since)

    def _run(self, items: list[tuple[Callback, BaseException | None]], on_disk_since: float) -> None:
        """Run a batch's completions; a traced SEND's span learns when the batch was on
        our disk (loop time ``on_disk_since``): what follows is the wait for the slave."""
        tracer = self.server.tracer
        if tracer is None or self._gated is None:
            run_completions(items)
            return
        tracer.durable_ns = time.time_ns() - int((self.loop.time() - on_disk_since) * 1e9)
        try:
            run_completions(items)
        finally:
            tracer.durable_ns = None

    def _refuse(self, batches: list[list[tuple[Callback, BaseException | None]]], reason: str,
                *, for_now: bool = False) -> None:
        """Never receipt these: cut every client connection first (their clients fail over
        and replay what was not receipted; idempotency keys drop the copies), then run the
        completions with an error once the connections are gone (so the store's own
        bookkeeping, e.g. duplicate waiters, completes and no RECEIPT or ERROR is written).
        ``for_now``: the node goes on as master (suspect), so the error is a
        :class:`~..store.NotReceipted`: the records are on our disk and whoever waits
        again (a new scheduled job) learns when they may count after all."""
        n = sum(len(items) for items in batches)
        if not n:
            return
        self.refused_receipts += n
        cut = self.server.abort_connections()
        now = self.loop.time()
        if now - self._refused_logged >= 10.0:
            self._refused_logged = now
            log.error("replication: %d completions will never be receipted (%s); cut %d client connections so "
                      "their clients replay (%d so far)", n, reason, cut, self.refused_receipts)
        err = (NotReceipted if for_now else JournalError)(f"not receipted: {reason}")
        items: list[tuple[Callback, BaseException | None]] = [(cb, e or err) for batch in batches for cb, e in batch]
        self.loop.call_soon(run_completions, items)  # after the connections' connection_lost

    @property
    def serving(self) -> bool:
        """False while receipts are held for a peer check or refused for good: new client
        sessions would only wait (the node refuses their CONNECT)."""
        return self.suspect is None and self._fatal is None

    def _stall_start(self) -> float | None:
        """When the loop's stall began (its last tick), if the stall timer is overdue by
        more than ``link_timeout`` (frozen by SIGSTOP, a pause); else None."""
        if self.loop.time() - self._tick_due > self.link_timeout:
            return self._tick_due - self._tick_every
        return None

    def suspect_now(self, reason: str) -> None:
        """Hold every completion a slave ack does not cover until :meth:`clear_suspect`.
        The hold counts (``suspect_since``, decide.py's refusal window) from now, or from
        the start of a stall this loop just woke from, whichever saw it first (a lost
        slave link or :meth:`check_stall`): the slave may have taken over during the stall
        and died since, so a peer that refuses now proves nothing (a no-witness soak lost
        receipted messages so: the frozen master, thawed just after the new master's kill,
        cleared on the refusals and receipted alone at the old epoch; the restarted peer's
        newer store won)."""
        stalled = self._stall_start()
        if self.suspect is not None and stalled is not None:
            self.suspect_since = min(self.suspect_since, stalled)
        if self.suspect is None and self._fatal is None:
            self.suspect = reason
            self.suspect_since = self.loop.time() if stalled is None else stalled
            log.warning("replication: receipts without a slave ack are held: %s", reason)
            _safe(self.on_suspect, reason)

    def check_stall(self) -> None:
        """Become suspect if the loop stalled: the stall timer is overdue by more than
        ``link_timeout`` (frozen by SIGSTOP, a pause: the slave may have taken over
        meanwhile). Called by that timer, and before input read after a gap is acted on
        (a client CONNECT, a completion about to become a receipt): a thawed loop reads
        its sockets before it runs its overdue timers when it was frozen in mid-turn."""
        lag = self.loop.time() - self._tick_due
        if lag > self.link_timeout:
            self.suspect_now(f"the event loop stalled for {lag:.1f} s, longer than --link-timeout "
                             f"{self.link_timeout:g} s")
        if self.lease_until is not None and self._gated is None and self.loop.time() >= self.lease_until:
            self.suspect_now("the witness lease ran out (receipting alone needs it: the slave may be granted "
                             "mastership now)")

    def clear_suspect(self, reason: str, lease_until: float | None = None) -> None:
        """Receipt alone again; with ``lease_until`` (loop time) only while the witness
        lease lasts (:attr:`lease_until`, renewed by the node), else unconditionally."""
        self.lease_until = lease_until
        if self.suspect is None:
            return
        log.warning("replication: receipts resume (%s); %d batches held were waiting", reason, len(self._held))
        self.suspect = None
        self._release()
        _safe(self.on_clear, reason)

    def _tick(self) -> None:
        """Notice a stalled loop; drop an in-sync slave that leaves a batch unacknowledged
        for ``link_timeout``."""
        self.check_stall()
        self._tick_due = self.loop.time() + self._tick_every
        self._timer = self.loop.call_at(self._tick_due, self._tick)
        link = self._gated
        if link is None or not link.synced or not self._held:
            return
        target, since, _items = self._held[0]
        waited = self.loop.time() - max(since, link.synced_loop_time)
        if waited > self.link_timeout:
            self.gate_timeouts += 1
            link.abort(f"no ack for seq {target} within {self.link_timeout} s")

    def on_record(self, record: Record, payload: bytes, segment: int) -> None:
        self.seq += 1
        self.streamed_bytes += len(payload)
        link = self.link
        if link is not None:
            link.push(self.seq, payload)
            if not self._mark_due:
                self._mark_due = True
                self.loop.call_soon(self._mark)

    def _mark(self) -> None:
        self._mark_due = False
        if self.link is not None:
            self._marks.append((self.seq, self.streamed_bytes))

    @property
    def lag(self) -> tuple[int, int] | None:
        """(records, bytes) streamed to the attached slave and not yet on its disk, counted
        from the full sync's base while it syncs; None with no slave attached."""
        link = self.link
        if link is None:
            return None
        acked = max(self._acked, link.base)
        return max(0, self.seq - acked), max(0, self.streamed_bytes - self._acked_bytes)

    def attach(
        self, transport: asyncio.Transport, slave: str, answer: bytes, info: Mapping[str, str] | None = None
    ) -> MasterLink:
        old = self.link
        base = self.seq
        link = MasterLink(self, transport, slave, base)
        link.info = dict(info or {})
        self.link = link
        if old is not None:
            # the slave re-links over a connection we still think open (half-open TCP):
            # not a lost slave. What waited for the old link now waits for the new one,
            # whose full sync covers every record so far (base >= every held target).
            old.abort(f"replaced by a new connection from slave {slave}")
        self._acked = 0
        self._gated = link
        self._marks.clear()
        self._acked_bytes = self.streamed_bytes  # what came before is in the snapshot
        snapshot = SnapshotReader(self.store)
        link.start(answer, snapshot)
        log.info(
            "replication: slave %s attached from %s; full sync of %d messages (up to seq %d), streamed",
            slave, link.peer, snapshot.messages, base,
        )
        return link

    def _on_ack(self, link: MasterLink, seq: int) -> None:
        if link is not self.link:
            return
        if seq > self._acked:
            self._acked = seq
        link.acked = seq
        marks = self._marks
        while marks and marks[0][0] <= seq:
            self._acked_bytes = marks.popleft()[1]
        if not link.synced and seq >= link.base:
            link.synced = True
            link.synced_at = time.monotonic()
            link.synced_loop_time = self.loop.time()
            log.info("replication: slave %s is in sync (seq %d)", link.slave, seq)
            _safe(self.on_synced, link)
        self._release()

    def _link_lost(self, link: MasterLink, reason: str) -> None:
        if link is not self.link:
            return
        self.link = None
        # synced as far as the slave may know: it marks its copy complete once SYNC_END is
        # durable there, before its ack reaches us (a link lost in between, then a master
        # that receipted alone and was lost: the slave took over without those receipts)
        was_synced = (link.synced or link.sync_ended) and not link.bye
        if self._gated is link:
            self._gated = None
        level = logging.INFO if link.bye else logging.WARNING
        log.log(level, "replication: slave %s detached: %s", link.slave, reason)
        if was_synced:
            # no goodbye: the slave may be taking over right now. What waited for its ack
            # may be missing on the next master: never receipt it (issue: a thawed master
            # receipted SENDs the new master never had).
            held, self._held = self._held, deque()
            self._refuse([items for _t, _s, items in held], f"slave {link.slave} lost before it acknowledged them",
                         for_now=not self.shutdown_on_slave_failure)
            if self.shutdown_on_slave_failure:
                self._fatal = f"slave {link.slave} lost ({reason}) and --shutdown-on-slave-failure is set"
            else:
                self.suspect_now(f"synced slave {link.slave} lost without a goodbye ({reason})")
        self._release()
        _safe(self.on_lost, link, reason, was_synced)

    @property
    def acked(self) -> int:
        return self._acked

    @property
    def held(self) -> int:
        """Completions waiting (for a slave ack, or for the peer check while suspect)."""
        return sum(len(items) for _t, _s, items in self._held)


def _safe(fn: Callable[..., None], *args: object) -> None:
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - a node callback bug must not break replication
        log.exception("replication callback %r failed", fn)
