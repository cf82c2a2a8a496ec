"""Persistence for the embedded broker: records, the journal, the dedupe window, the store."""

from .dedupe import DedupeWindow
from .journal import (
    BatchHook,
    Callback,
    Journal,
    JournalError,
    StoreLockedError,
    run_completions,
    scan_segment,
)
from .records import Ack, Enq, Keys, Move, Record, RecordError, Sub, Tx, Unsub, decode, encode
from .store import ORIGINAL_DESTINATION, MessageStore, StoreListener, StoreStats

__all__ = [
    "Ack",
    "BatchHook",
    "Callback",
    "DedupeWindow",
    "Enq",
    "Journal",
    "JournalError",
    "Keys",
    "MessageStore",
    "Move",
    "ORIGINAL_DESTINATION",
    "Record",
    "RecordError",
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
