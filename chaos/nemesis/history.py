"""The nemesis's recorded history: every operation and its outcome, every fault.

Theory of operation
-------------------
The workload threads, the fault executor and the port probes *append* to one
:class:`History` while a run goes; the checker (:mod:`chaos.nemesis.checker`) is a
pure function of it, and ``report.json`` carries it, so a run can be judged again
offline (``load_history``) and a checker change can be tried on an old run.

Times are seconds on one monotonic clock, from the run's start. Records are small
named tuples kept in one list per kind; the JSON form is ``{kind: {"fields": [...],
"rows": [[...], ...]}}`` (compact: a long run holds hundreds of thousands of rows). A kind that gained fields
(with defaults) since a report was written still loads: the missing trailing fields
take their defaults.

Kinds (see each tuple's fields):

``subscribers``
    who reads what: name, destination, ack mode (``auto`` / ``client`` /
    ``client-individual``), durable or not, its JMS ``selector`` ("": none). A message
    sent to a destination must reach every subscriber of it that is not ``auto``
    (``auto`` is at-most-once); the messages of the selector feature (a ``k`` in their
    ``props``) are judged by its own rules instead.
``sends``
    one per message sent outside a transaction: ``kind`` ``rcpt`` (receipted) or
    ``ff`` (fire-and-forget), ``outcome`` ``ok`` (receipt in), ``fail`` (the broker
    refused it with an ERROR), ``unknown`` (timed out or the connection died before
    the receipt) or ``none`` (fire-and-forget: nothing to wait for).
``txs``
    one per transaction: its keys and ``outcome`` ``committed`` (COMMIT receipted),
    ``in-doubt`` (the COMMIT was sent, its outcome never came) or ``aborted``
    (failed or rolled back before the COMMIT was written).
``deliveries``
    one per MESSAGE frame: ``stage`` ``wire`` (as it arrived, before the client's
    duplicate filter) or ``app`` (handed to the application), with the link
    ``generation`` it came on.
``acks``
    one per ACK written by a client-acknowledging subscriber (link generation).
``syncs``
    a subscriber's receipted persistent SEND to its own sync queue: the broker
    processes a connection's frames in order and receipts after the journal (and the
    slave) has everything before, so a sync started after an ACK and receipted on the
    same link (``gen_before == gen_after``) proves that ACK durable.
``props``
    the ActiveMQ features a producer asked for on one message (:mod:`chaos.nemesis.features`):
    its JMS ``priority`` (-1: none given), ``delay_ms`` (``AMQ_SCHEDULED_DELAY``, 0:
    none), ``group`` (``JMSXGroupID``, "": none), ``batch`` (the backlog it was sent
    in, for the priority rule; 0: none) and ``k`` (the string property a selector
    reads, ``hit`` or ``miss``; "": none). Its ``Send`` record says how the send went.
``faults``
    what the nemesis did, to which node (``target``), from ``t`` to ``t_end``.
``probes``
    runs of consecutive identical results of the 50 ms client-port probe of one node:
    ``answered`` (a STOMP CONNECTED came back) or not, with the first and last probe's
    start and end times and how many probes the run had.
``rounds``
    one per round: its seed and plan, its time span, and whether the pair came back
    to a master and an in-sync slave (``healthy``) within the bound.
``errors``
    client-side errors worth reading next to a violation (who, what).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

__all__ = [
    "Subscriber",
    "Send",
    "Tx",
    "Delivery",
    "Ack",
    "Sync",
    "MessageProps",
    "Fault",
    "ProbeRun",
    "RoundRecord",
    "ClientError",
    "History",
    "load_history",
]


class Subscriber(NamedTuple):
    name: str
    dest: str
    ack: str  # auto | client | client-individual
    durable: bool = False
    selector: str = ""  # the subscription's JMS selector; "": none


class Send(NamedTuple):
    t: float
    client: str
    dest: str
    key: str
    kind: str  # rcpt | ff
    outcome: str  # ok | fail | unknown | none
    t_done: float
    error: str = ""


class Tx(NamedTuple):
    t: float
    client: str
    dest: str
    tx: str
    keys: tuple[str, ...]
    outcome: str  # committed | in-doubt | aborted
    t_done: float
    error: str = ""


class Delivery(NamedTuple):
    t: float
    sub: str
    key: str
    msg_id: str
    gen: int
    stage: str  # wire | app


class Ack(NamedTuple):
    t: float
    sub: str
    key: str
    gen: int


class Sync(NamedTuple):
    t: float
    sub: str
    gen_before: int
    gen_after: int
    t_done: float
    ok: bool


class MessageProps(NamedTuple):
    t: float
    key: str
    priority: int = -1  # -1: no priority header
    delay_ms: int = 0  # AMQ_SCHEDULED_DELAY; 0: none
    group: str = ""  # JMSXGroupID; "": none
    batch: int = 0  # the priority backlog it belongs to; 0: none
    k: str = ""  # the selector feature's property: "hit" or "miss"; "": none


class Fault(NamedTuple):
    t: float
    t_end: float
    round: int
    kind: str
    target: str
    detail: str


class ProbeRun(NamedTuple):
    node: str
    answered: bool
    first_t0: float
    first_t1: float
    last_t0: float
    last_t1: float
    n: int  # probes in the run


class RoundRecord(NamedTuple):
    round: int
    seed: int
    mode: str
    t: float
    t_end: float
    plan: str
    healthy: bool
    health_s: float
    detail: str = ""


class ClientError(NamedTuple):
    t: float
    client: str
    error: str


KINDS: dict[str, type[Any]] = {
    "subscribers": Subscriber,
    "sends": Send,
    "txs": Tx,
    "deliveries": Delivery,
    "acks": Ack,
    "syncs": Sync,
    "props": MessageProps,
    "faults": Fault,
    "probes": ProbeRun,
    "rounds": RoundRecord,
    "errors": ClientError,
}


class History:
    """Append-only record of a run (thread-safe appends); see the module docstring."""

    def __init__(self, meta: Mapping[str, Any] | None = None) -> None:
        self.meta: dict[str, Any] = dict(meta or {})
        self.subscribers: list[Subscriber] = []
        self.sends: list[Send] = []
        self.txs: list[Tx] = []
        self.deliveries: list[Delivery] = []
        self.acks: list[Ack] = []
        self.syncs: list[Sync] = []
        self.props: list[MessageProps] = []
        self.faults: list[Fault] = []
        self.probes: list[ProbeRun] = []
        self.rounds: list[RoundRecord] = []
        self.errors: list[ClientError] = []
        self.t_end: float = 0.0
        self._lock = threading.Lock()

    def add(self, record: Any) -> None:
        kind = _KIND_OF[type(record)]
        with self._lock:
            getattr(self, kind).append(record)

    def extend(self, records: Iterable[Any]) -> None:
        for r in records:
            self.add(r)

    def snapshot(self) -> History:
        """A copy whose lists no longer grow (for a check while the run goes on)."""
        copy = History(self.meta)
        with self._lock:
            for kind in KINDS:
                setattr(copy, kind, list(getattr(self, kind)))
            copy.t_end = self.t_end
        return copy

    def since(self, t_from: float, slack: float = 30.0) -> History:
        """A copy holding the tail of each list from about ``t_from`` on (rows are appended
        in nearly time order: the cut is the first row at or after ``t_from - slack``).
        For a quick check while the run goes on: missing older rows can only hide a
        violation (an ack's proof, an earlier copy), never invent one."""
        copy = History(self.meta)
        with self._lock:
            for kind in KINDS:
                rows = getattr(self, kind)
                if kind in ("subscribers", "rounds"):
                    setattr(copy, kind, list(rows))
                    continue
                i = len(rows)
                while i > 0 and _start(rows[i - 1]) >= t_from - slack:
                    i -= 1
                setattr(copy, kind, rows[i:])
            copy.t_end = self.t_end
        return copy

    def counts(self) -> dict[str, int]:
        return {kind: len(getattr(self, kind)) for kind in KINDS}

    def to_json(self) -> dict[str, Any]:
        with self._lock:
            data: dict[str, Any] = {"meta": self.meta, "t_end": self.t_end}
            for kind, cls in KINDS.items():
                data[kind] = {"fields": list(cls._fields), "rows": [_row(r) for r in getattr(self, kind)]}
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> History:
        h = cls(data.get("meta") or {})
        h.t_end = float(data.get("t_end", 0.0))
        for kind, tcls in KINDS.items():
            block = data.get(kind) or {}
            fields = block.get("fields") or list(tcls._fields)
            if list(fields) != list(tcls._fields)[:len(fields)]:  # older reports: a prefix
                raise ValueError(f"history {kind}: fields {fields} do not match {list(tcls._fields)}")
            rows = [tcls(*(tuple(v) if isinstance(v, list) else v for v in row)) for row in block.get("rows", [])]
            setattr(h, kind, rows)
        return h


_KIND_OF: dict[type[Any], str] = {cls: kind for kind, cls in KINDS.items()}


def _start(record: Any) -> float:
    return float(record.first_t0 if isinstance(record, ProbeRun) else record.t)


def _row(record: Any) -> list[Any]:
    return [round(v, 4) if isinstance(v, float) else (list(v) if isinstance(v, tuple) else v) for v in record]


def load_history(path: str | Path, mode: str | None = None) -> History:
    """The history of ``mode`` (or of the only mode) from a nemesis ``report.json``."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    histories = data.get("histories", {})
    if mode is None:
        if len(histories) != 1:
            raise ValueError(f"{path}: pick a mode among {', '.join(histories)}")
        mode = next(iter(histories))
    return History.from_json(histories[mode])
