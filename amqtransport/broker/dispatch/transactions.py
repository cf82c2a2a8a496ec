"""Transactions: BEGIN .. COMMIT/ABORT of one connection."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..store import Ack, Enq, JournalError, Keys, NotReceipted, RecordError
from ..store.journal import Callback
from ..store.records import TxPart
from .acks import Acks
from .errors import CoreError
from .memory import send_size
from .message import Message
from .model import Subscription, TxSend, TxState
from .names import Headers, check_send_destination, send_targets
from .priority import check_priority
from .registry import Registry
from .scheduling import Schedule, first_due, job_destination, job_headers, read_schedule
from .topics import FanOut

__all__ = ["Transactions"]


@dataclass
class _Plan:
    """What a batch of SENDs does: its journal records, the messages to route, the keys
    of messages not persisted, and how many were duplicates."""

    records: list[TxPart] = field(default_factory=list)
    routed: list[tuple[str, str, Message, list[Message]]] = field(default_factory=list)
    memory_keys: list[tuple[str, str]] = field(default_factory=list)
    duplicates: int = 0
    jobs: list[tuple[Message, float]] = field(default_factory=list)  # scheduled (scheduling.py), due


class Transactions:
    """BEGIN .. COMMIT/ABORT: sends held until COMMIT, acks and nacks applied at COMMIT,
    everything a COMMIT does written as one atomic journal record."""

    def __init__(self, reg: Registry, fanout: FanOut, acks: Acks) -> None:
        self.reg = reg
        self.fanout = fanout
        self.acks = acks
        #: takes each scheduled job (scheduling.py) once it is written, with when it is due
        self.on_job: Callable[[Message, float], None] | None = None

    def tx_send(
        self,
        tx: TxState,
        destination: str,
        headers: tuple[tuple[str, str], ...],
        body: bytes,
        *,
        persistent: bool,
        key: str = "",
    ) -> None:
        """Hold a SEND until ``tx`` commits; its bytes count against the memory limits
        meanwhile, and a transaction may hold at most ``max_transaction_size`` bytes."""
        targets = send_targets(destination, headers)  # a composite: one send per part
        check_priority(headers)  # refused now, not at COMMIT
        if self.reg.config.scheduler_support:
            read_schedule(headers)  # wrong AMQ_SCHEDULED_* headers are refused at the SEND
        size = sum(send_size(h, body) for _d, h in targets)
        limit = self.reg.config.max_transaction_size
        if tx.size + size > limit:
            raise CoreError(
                f"transaction {tx.id!r} would hold {tx.size + size} bytes of messages, over "
                f"max_transaction_size={limit}: send refused, the transaction is rolled back "
                "(commit in smaller transactions)"
            )
        for dest, hdrs in targets:
            part = send_size(hdrs, body)
            tx.sends.append(TxSend(dest, hdrs, body, persistent, key, part))
            tx.size += part
            self.reg.memory.reserve(dest, part)

    def commit(self, tx: TxState, callback: Callback | None = None) -> None:
        """Apply a transaction: everything it does -- queue messages, the durable
        subscribers' copies of its topic messages, their idempotency keys, its acks -- in
        one atomic journal record; ``callback`` runs once that record is durable."""
        reg = self.reg
        store = reg.store
        plan = self.plan(tx.sends, tx.origin)
        routed = len(plan.routed) + len(plan.jobs)
        callback = self._jobs_once_durable(plan, callback)
        ack_ids = [m.id for sub, m in tx.acked if sub.kind == "queue" and m.persistent]
        if ack_ids:
            plan.records.append(Ack(tuple(ack_ids)))
        if store is not None:
            try:
                store.commit(plan.records, callback)
            except (RecordError, JournalError) as exc:  # nothing was written
                self.abort(tx)
                if isinstance(exc, JournalError):
                    raise
                raise CoreError(f"transaction {tx.id!r} cannot be committed: {exc}") from None
            for destination, key in plan.memory_keys:
                store.remember_key(destination, key)
        else:
            reg.done(callback)
        reg.sent += routed
        reg.duplicates += plan.duplicates
        for sub, m in tx.acked:
            reg.memory.release(m)
            if sub.kind == "queue":
                self.acks.count_dequeued(sub, [m])
        for send in tx.sends:  # the messages are charged as they are enqueued below
            reg.memory.unreserve(send.destination, send.size, settle=False)
        self.route(plan)
        reg.memory.settle({send.destination for send in tx.sends})
        for sub, m in tx.nacked:
            self.acks.return_unacked(sub, [m], count_failure=True)
        self._clear(tx)

    def send_batch(self, sends: Sequence[TxSend], origin: str, callback: Callback | None) -> int:
        """Accept several SENDs at once (a composite destination's copies): the
        persistent ones in one atomic journal record, ``callback`` once it is durable.
        Returns how many were routed (the others were duplicates of their keys)."""
        reg = self.reg
        store = reg.store
        plan = self.plan(sends, origin)
        routed = len(plan.routed) + len(plan.jobs)
        callback = self._jobs_once_durable(plan, callback)
        if store is not None:
            try:
                store.commit(plan.records, callback)
            except RecordError as exc:  # nothing was written
                raise CoreError(f"message refused: {exc}") from None
            for destination, key in plan.memory_keys:
                store.remember_key(destination, key)
        else:
            reg.done(callback)
        reg.sent += routed
        reg.duplicates += plan.duplicates
        self.route(plan)
        return routed

    def _jobs_once_durable(self, plan: _Plan, callback: Callback | None) -> Callback | None:
        """Take the new jobs out of ``plan``: they join the scheduler only once their
        record is durable (on a replicated master: on the slave too). A job that fired
        before its SEND was receipted could be created again from the producer's replay
        on the next master, and fire twice under two job ids."""
        jobs, on_job = plan.jobs, self.on_job
        if not jobs or on_job is None:
            return callback
        plan.jobs = []
        reg = self.reg

        def schedule(err: BaseException | None) -> None:
            if err is None:
                for job, due in jobs:
                    on_job(job, due)
            elif isinstance(err, NotReceipted):
                # not receipted (the slave was lost before it acked), but the job is on our
                # disk and we stay master: the producer's replay is a duplicate of it, so
                # it fires once the record counts after all (a slave has it, or the peer
                # did not take over) -- else it would never fire (nemesis: lost p-sched)
                reg.done(schedule)

        def durable(err: BaseException | None) -> None:
            schedule(err)
            if callback is not None:
                callback(err)

        return durable

    def plan(self, sends: Sequence[TxSend], origin: str) -> _Plan:
        """The messages ``sends`` make (minus duplicates of their keys) and the journal
        records that persist them."""
        reg = self.reg
        store = reg.store
        plan = _Plan()
        seen_keys: set[tuple[str, str]] = set()
        for destination, headers, body, persistent, key, _size in sends:
            kind, name = check_send_destination(destination)
            if key and (
                (store is not None and store.is_duplicate(destination, key)) or (destination, key) in seen_keys
            ):
                plan.duplicates += 1
                continue
            sched = read_schedule(headers) if reg.config.scheduler_support else None
            if sched is not None:  # a job: held until due (scheduling.py)
                scope = job_destination(destination)
                if key and (
                    (store is not None and store.is_duplicate(scope, key)) or (scope, key) in seen_keys
                ):
                    plan.duplicates += 1
                    continue
                if key:
                    seen_keys.add((scope, key))
                self.add_job(plan, scope, headers, body, key, origin, sched)
                continue
            if key:
                seen_keys.add((destination, key))
            msg = reg.make_message(destination, headers, body, persistent, key)
            msg.origin = origin
            copies = self.fanout.durable_copies(name, msg) if kind == "topic" else []
            if msg.persistent and kind == "queue":
                plan.records.append(Enq(msg))
            elif msg.persistent and copies:
                fan = store.fan_record(msg, copies) if store is not None else None
                if fan is not None:  # stored once, its key with it (store/fanout.py)
                    plan.records.append(fan)
                else:
                    plan.records.extend(Enq(c) for c in copies)
                    if key:
                        plan.records.append(Keys(((destination, key, msg.timestamp),)))
            elif key:
                plan.memory_keys.append((destination, key))
            plan.routed.append((kind, name, msg, copies))
        return plan

    def add_job(
        self, plan: _Plan, scope: str, headers: Headers, body: bytes, key: str, origin: str, sched: Schedule
    ) -> None:
        """A newly scheduled job (scheduling.py) into ``plan``: its record and its due time."""
        reg = self.reg
        now = reg.clock()
        due = first_due(sched, now)
        job_id = reg.new_id()
        job = Message(
            id=job_id, destination=scope, headers=job_headers(headers, due=due, left=sched.repeat, job=job_id),
            body=body, key=key, timestamp=now, persistent=reg.store is not None, origin=origin,
        )
        if job.persistent:
            plan.records.append(Enq(job))
        elif key:
            plan.memory_keys.append((scope, key))
        plan.jobs.append((job, due))

    def route(self, plan: _Plan) -> None:
        if self.on_job is not None:
            for job, due in plan.jobs:
                self.on_job(job, due)
        for kind, name, msg, copies in plan.routed:
            if kind == "queue":
                self.reg.queue(msg.destination).enqueue(msg)
            else:
                self.fanout.fan_out(name, msg, copies)

    def abort(self, tx: TxState) -> None:
        """Drop a transaction's sends; messages it acked are redelivered."""
        by_sub: dict[int, tuple[Subscription, list[Message]]] = {}
        for sub, m in (*tx.acked, *tx.nacked):
            by_sub.setdefault(id(sub), (sub, []))[1].append(m)
        for sub, msgs in by_sub.values():
            if sub.kind == "queue":
                self.acks.return_unacked(sub, msgs, count_failure=True)
        for send in tx.sends:
            self.reg.memory.unreserve(send.destination, send.size)
        self._clear(tx)

    @staticmethod
    def _clear(tx: TxState) -> None:
        tx.sends.clear()
        tx.acked.clear()
        tx.nacked.clear()
        tx.size = 0
