"""Streaming reader of the ``amq`` data source: a queue, at-least-once.

Theory of operation
-------------------
Spark keeps one long-lived driver-side Python process per streaming source and calls
``initialOffset`` / ``latestOffset`` / ``partitions`` / ``commit`` on the same reader
object there; ``read(partition)`` runs on executors with a pickled copy. A queue has
no replayable offsets, so the driver-side reader makes its own:

1. ``latestOffset(start, limit)`` receives up to the limit from a ``client-individual``
   subscription and **appends every new message to a write-ahead log** (``walPath``,
   a JSON-lines file, fsynced) with a sequence number before it returns. An offset is
   ``{"seq": n}``: the count of messages ever logged. Spark writes the offset to its
   own offset log only after this returns, so a planned batch is always in our WAL.
2. ``partitions(start, end)`` cuts the logged messages ``start < seq <= end`` into
   ``numPartitions`` input partitions that carry the rows themselves (executors need no
   connection and no access to the WAL, so it works on a cluster).
3. ``commit(end)`` (after Spark committed the batch) acks every message ``seq <= end``
   on the live subscription, then records ``acked through end`` and compacts the WAL.

Restarts and failover. Unacked messages come back from the broker (after a failover
of our connection, or to a restarted query). A message is known by its idempotency key
(or message-id): one already in the WAL but not committed just gets its new ack handle
(it is *not* logged again: the batch that planned it will be replayed from the WAL);
one already committed is acked and dropped (a bounded set of recently committed keys is
kept in the WAL directory). So: nothing is acked before the batch that holds it is
committed by Spark (at-least-once), and redeliveries of planned messages do not make
duplicates in the stream.

Limits, honestly: (a) the WAL lives on the driver's disk: point ``walPath`` at durable
storage next to the checkpoint (Spark does not tell a Python source its checkpoint
location, so it is an option); losing it while batches are planned-but-uncommitted
makes the replay fail with a clear error instead of silently skipping; (b) the
committed-keys set is bounded (``_DONE_KEEP`` keys in memory, the newest
``_DONE_PERSIST`` across a restart), so a message acked long ago and redelivered after
more than that many later messages would be read again; (c) a
message's ack is lost if our connection fails over after ``commit`` sent it but before
the broker processed it: it is then redelivered and dropped by (b); (d) the sink side
decides end-to-end exactly-once: write to ``amq`` again with an ``id`` column holding
the idempotency key to keep it exactly-once at the next queue.
"""

from __future__ import annotations

import base64
import json
import logging
import os
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from amqtransport.spark.options import ReaderOptions

__all__ = ["READER_SCHEMA", "AmqStreamReader", "AmqInputPartition", "WriteAheadLog", "WalRecord"]

log = logging.getLogger(__name__)

READER_SCHEMA = (
    "body binary, headers map<string,string>, destination string, message_id string, "
    "idempotency_key string, redelivered boolean, seq long"
)

_DONE_KEEP = 100_000  # recently committed keys kept in memory
_DONE_PERSIST = 20_000  # ... and the newest of them kept across a restart (done.json)


@dataclass(frozen=True)
class WalRecord:
    seq: int
    key: str
    destination: str
    message_id: str
    body: bytes
    headers: dict[str, str]
    redelivered: bool

    def to_json(self) -> str:
        return json.dumps(
            {
                "seq": self.seq,
                "key": self.key,
                "dest": self.destination,
                "mid": self.message_id,
                "body": base64.b64encode(self.body).decode("ascii"),
                "headers": self.headers,
                "redelivered": self.redelivered,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, line: str) -> WalRecord:
        """Parse one log line; ValueError (only) for anything that is not a whole record."""
        try:
            return cls._from_dict(json.loads(line))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a WAL record: {line[:80]!r}") from exc

    @classmethod
    def _from_dict(cls, d: Any) -> WalRecord:
        return cls(
            seq=int(d["seq"]),
            key=str(d["key"]),
            destination=str(d["dest"]),
            message_id=str(d["mid"]),
            body=base64.b64decode(d["body"], validate=True),
            headers={str(k): str(v) for k, v in d["headers"].items()},
            redelivered=bool(d["redelivered"]),
        )

    def row(self) -> tuple[Any, ...]:
        return (self.body, self.headers, self.destination, self.message_id, self.key, self.redelivered, self.seq)


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _atomic_write(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(path))


class WriteAheadLog:
    """The reader's durable state: pending records, the acked-through mark, recent done keys.

    Files in ``directory``: ``log.jsonl`` (records, append + fsync), ``acked.json``
    (``{"acked_through": n}``), ``done.json`` (recently committed keys).
    """

    def __init__(self, directory: str) -> None:
        self.directory = os.path.abspath(directory)
        os.makedirs(self.directory, exist_ok=True)
        self.log_path = os.path.join(self.directory, "log.jsonl")
        self.acked_path = os.path.join(self.directory, "acked.json")
        self.done_path = os.path.join(self.directory, "done.json")
        self.acked_through = 0
        self.records: OrderedDict[int, WalRecord] = OrderedDict()  # seq > acked_through
        self.by_key: dict[str, int] = {}
        self.done: OrderedDict[str, None] = OrderedDict()
        self._load()

    def _load(self) -> None:
        if os.path.exists(self.acked_path):
            with open(self.acked_path, encoding="utf-8") as fh:
                self.acked_through = int(json.load(fh)["acked_through"])
        if os.path.exists(self.done_path):
            with open(self.done_path, encoding="utf-8") as fh:
                for key in json.load(fh):
                    self.done[str(key)] = None
        torn = False
        if os.path.exists(self.log_path):
            with open(self.log_path, encoding="utf-8") as fh:
                for line in fh:
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        rec = WalRecord.from_json(line)
                    except ValueError:
                        log.warning("amq reader: dropping a torn last line of %s", self.log_path)
                        torn = True
                        break
                    if rec.seq <= self.acked_through:
                        self.done[rec.key] = None
                        continue
                    self.records[rec.seq] = rec
                    self.by_key[rec.key] = rec.seq
        if torn:  # rewrite without it, or the next append would extend the torn line
            _atomic_write(self.log_path, "".join(r.to_json() + "\n" for r in self.records.values()))
        self._trim_done()

    @property
    def last_seq(self) -> int:
        return next(reversed(self.records)) if self.records else self.acked_through

    def append(self, records: list[WalRecord]) -> None:
        if not records:
            return
        with open(self.log_path, "a", encoding="utf-8") as fh:
            fh.write("".join(r.to_json() + "\n" for r in records))
            fh.flush()
            os.fsync(fh.fileno())
        for r in records:
            self.records[r.seq] = r
            self.by_key[r.key] = r.seq

    def between(self, start: int, end: int) -> list[WalRecord]:
        out = [r for s, r in self.records.items() if start < s <= end]
        if len(out) != end - start:
            have = sorted(s for s in self.records if start < s <= end)
            raise RuntimeError(
                f"amq reader: the write-ahead log at {self.directory} holds {len(have)} of the "
                f"{end - start} messages of offsets ({start}, {end}] that Spark asks to replay; "
                f"was walPath changed or deleted? (acked through {self.acked_through})"
            )
        return out

    def mark_acked(self, end: int) -> None:
        """Everything ``seq <= end`` is committed and acked: persist, compact, remember keys."""
        if end <= self.acked_through:
            return
        for seq in [s for s in self.records if s <= end]:
            rec = self.records.pop(seq)
            self.by_key.pop(rec.key, None)
            self.done[rec.key] = None
        self._trim_done()
        recent = list(self.done)[-_DONE_PERSIST:]
        _atomic_write(self.done_path, json.dumps(recent))
        _atomic_write(self.acked_path, json.dumps({"acked_through": end}))
        self.acked_through = end
        _atomic_write(self.log_path, "".join(r.to_json() + "\n" for r in self.records.values()))

    def _trim_done(self) -> None:
        while len(self.done) > _DONE_KEEP:
            self.done.popitem(last=False)


class AmqInputPartition(InputPartition):
    """Rows of one slice of a micro-batch, carried with the partition (no executor I/O)."""

    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        super().__init__(len(rows))
        self.rows = rows


class AmqStreamReader(DataSourceStreamReader):
    """``spark.readStream.format("amq").option("destination", q).option("walPath", p).load()``."""

    def __init__(self, options: ReaderOptions) -> None:
        self.options = options
        # Lazily built on the driver-side process only (the planner and executors get a
        # pickled copy without them).
        self._wal: WriteAheadLog | None = None
        self._conn: Any = None
        self._sub: Any = None
        self._handles: dict[int, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]

    # -- driver side ------------------------------------------------------------------

    def _ensure(self) -> WriteAheadLog:
        if self._wal is None:
            self._wal = WriteAheadLog(self.options.wal_path)
        if self._conn is None:
            from amqtransport.client import connect

            o = self.options
            self._conn = connect(o.uri, login=o.login, passcode=o.passcode)
            self._sub = self._conn.subscribe(
                o.destination, ack="client-individual", prefetch=o.prefetch or o.max_batch_size
            )
        return self._wal

    def initialOffset(self) -> dict[str, int]:  # noqa: N802 - Spark's name
        wal = WriteAheadLog(self.options.wal_path) if self._wal is None else self._wal
        self._wal = wal
        return {"seq": wal.acked_through}

    def latestOffset(self, start: dict[str, int] | None = None, limit: Any = None) -> dict[str, int]:  # noqa: N802
        wal = self._ensure()
        committed = int(start["seq"]) if start else wal.acked_through
        if committed > wal.acked_through:
            self._ack_through(committed)  # Spark committed up to `start` (e.g. before a restart)
        budget = self.options.max_batch_size
        max_rows = getattr(limit, "max_rows", None)
        if isinstance(max_rows, int) and max_rows > 0:
            budget = min(budget, max_rows)
        next_seq = max(wal.last_seq, committed)
        new: list[WalRecord] = []
        timeout = self.options.receive_timeout
        while len(new) < budget:
            msg = self._sub.receive(timeout=timeout)
            if msg is None:
                break
            timeout = min(timeout, 0.01)  # drain what is already here, do not linger
            key = msg.idempotency_key or msg.message_id
            if key in wal.done:
                self._ack_quietly(msg)  # a redelivery of a committed message: ack, drop
                continue
            seq = wal.by_key.get(key)
            if seq is None:
                seq = next((r.seq for r in new if r.key == key), None)
            if seq is not None:  # a redelivery of a planned message: new handle, same seq
                self._handles[seq] = msg
                continue
            next_seq += 1
            headers = {str(k): str(v) for k, v in dict(msg.headers).items()}
            new.append(
                WalRecord(
                    seq=next_seq,
                    key=key,
                    destination=msg.destination or self.options.destination,
                    message_id=msg.message_id or "",
                    body=bytes(msg.body),
                    headers=headers,
                    redelivered=bool(msg.redelivered),
                )
            )
            self._handles[next_seq] = msg
        wal.append(new)  # durable before Spark plans a batch over these offsets
        return {"seq": wal.last_seq if wal.records else max(wal.acked_through, committed)}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[AmqInputPartition]:
        wal = self._wal if self._wal is not None else WriteAheadLog(self.options.wal_path)
        self._wal = wal
        records = wal.between(int(start["seq"]), int(end["seq"]))
        if not records:
            return []
        n = min(self.options.num_partitions, len(records))
        size = -(-len(records) // n)
        return [AmqInputPartition([r.row() for r in records[i : i + size]]) for i in range(0, len(records), size)]

    def commit(self, end: dict[str, int]) -> None:
        self._ack_through(int(end["seq"]))

    def _ack_through(self, end: int) -> None:
        wal = self._wal
        if wal is None:
            return
        for seq in sorted(s for s in self._handles if s <= end):
            self._ack_quietly(self._handles.pop(seq))
        wal.mark_acked(end)

    @staticmethod
    def _ack_quietly(msg: Any) -> None:
        try:
            msg.ack()
        except Exception:  # noqa: BLE001 - a lost ack means a redelivery, dropped by the done set
            log.warning("amq reader: ack failed (the message will be redelivered and dropped)", exc_info=True)

    def stop(self) -> None:
        conn, self._conn, self._sub = self._conn, None, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001
                log.debug("closing the reader connection failed", exc_info=True)

    # -- executors --------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, AmqInputPartition)
        yield from partition.rows
