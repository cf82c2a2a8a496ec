"""The HA state file ``<data-dir>/ha-state.json``: store epoch and what the node knows.

Theory of operation
-------------------
``epoch`` numbers the reigns of masters over one logical store: a node that becomes
master writes ``epoch + 1`` before it accepts a client, and a slave adopts the
master's epoch once its full sync is on disk. Comparing epochs tells which of two
stores is newer; a node whose epoch is older than a live master's never serves
clients: it joins as slave and resynchronises.

The other fields make a restart safe without an operator:

``synced``
    the store is a complete copy (false from the moment a slave starts wiping its
    store for a full sync until the snapshot is durable); an unsynced store never
    becomes master.
``role``
    what the node was when it last wrote the file (``master``/``slave``/``none``).
``peer_may_be_master``
    set by a master when a slave has synced from it (that slave could take over if we
    vanish); cleared when the slave leaves cleanly. A node that restarts with it set
    never makes itself master while the peer is unreachable: the peer may hold newer
    data.
``peer``
    the peer's addresses learnt during the replication handshake (``client``,
    ``ha``) and its ``name``, so a restarted node knows whom to ask.
``master_strict``
    set by a slave whose master runs with ``--shutdown-on-slave-failure``: that
    master never receipts without this store's ack, so while ``synced`` this copy
    holds every receipted message and may take over when the master is gone, even
    after a restart (a slave of a master that may serve alone waits for it instead).

Writes are atomic (temp file, fsync, rename, fsync of the directory).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..store.files import replace_file, write_all

__all__ = ["HaState", "STATE_FILE"]

log = logging.getLogger(__name__)

STATE_FILE = "ha-state.json"


@dataclass
class HaState:
    epoch: int = 0
    synced: bool = True
    role: str = "none"
    peer_may_be_master: bool = False
    peer: dict[str, str] = field(default_factory=dict)
    master_strict: bool = False

    @classmethod
    def load(cls, directory: str | Path) -> HaState:
        path = Path(directory) / STATE_FILE
        try:
            raw: Any = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError) as exc:
            # a torn state file cannot happen with rename, but never trust garbage:
            # an unknown state is "unsynced", which can only make us more careful
            log.error("HA state file %s unreadable (%s): treating the store as unsynced", path, exc)
            return cls(synced=False, peer_may_be_master=True)
        if not isinstance(raw, dict):
            return cls(synced=False, peer_may_be_master=True)
        peer = raw.get("peer") or {}
        try:
            return cls(
                epoch=int(raw.get("epoch", 0)),
                synced=bool(raw.get("synced", True)),
                role=str(raw.get("role", "none")),
                peer_may_be_master=bool(raw.get("peer_may_be_master", False)),
                peer={str(k): str(v) for k, v in peer.items()} if isinstance(peer, dict) else {},
                master_strict=bool(raw.get("master_strict", False)),
            )
        except (TypeError, ValueError, OverflowError) as exc:
            log.error("HA state file %s has bad values (%s): treating the store as unsynced", path, exc)
            return cls(synced=False, peer_may_be_master=True)

    def save(self, directory: str | Path) -> None:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        data = json.dumps(asdict(self), sort_keys=True).encode("utf-8")
        replace_file(d, STATE_FILE, lambda fd: write_all(fd, data), tmp_name=f"{STATE_FILE}.tmp{os.getpid()}")
