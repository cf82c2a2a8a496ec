"""Persistence for the embedded broker: records, the journal, the dedupe window, the store."""

from .dedupe import DedupeWindow
from .journal import (
    MAX_RECORD,
    BatchHook,
    Callback,
    Journal,
    JournalError,
    StoreLockedError,
    run_completions,
    scan_segment,
)
from .records import (
    Ack,
    Enq,
    Fan,
    Keys,
    Move,
    Record,
    RecordError,
    RecordTooLarge,
    Sub,
    Tx,
    Unsub,
    decode,
    encode,
)
from .store import ORIGINAL_DESTINATION, MessageStore, StoreListener, StoreStats

__all__ = [
    "MAX_RECORD",
    "Ack",
    "BatchHook",
    "Callback",
    "DedupeWindow",
    "Enq",
    "Fan",
    "Journal",
    "JournalError",
    "Keys",
    "MessageStore",
    "Move",
    "ORIGINAL_DESTINATION",
    "Record",
    "RecordError",
    "RecordTooLarge",
    "StoreListener",
    "StoreLockedError",
    "StoreStats",
    "Sub",
    "Tx",
    "Unsub",
    "decode",
    "encode",
    "run_completions",
    "scan_segment",
]
