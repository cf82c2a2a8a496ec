"""The witness's leases: who of a replicated pair may be master, as pure functions.

Theory of operation
-------------------
A two-node pair cannot tell a dead peer from a cut link. The witness (:mod:`.witness`,
``amq broker witness``; corosync's qnetd is the model) is a third party both nodes
ask: it holds, per pair, one *lease* on mastership. This module is its whole rule
book, a function of the request and of the witness's monotonic clock, passed in as
``now`` (tests never wait); the witness process only parses, persists and answers.

The pair's record (:class:`PairLease`): the node granted mastership last (``holder``),
the epoch it was granted at, whether its last renewal said it receipts *alone* (with no
in-sync slave: the slave's copy then lacks receipted messages), the lease's length, and
-- in memory only -- when the lease runs out. Two requests:

``renew`` (the master, every ``link_timeout / 3``)
    granted to the holder (at its epoch or a newer one), to the first node ever
    (no holder yet), or to a node at an epoch newer than a holder whose lease ran out.
    A renewal refused because another node was granted mastership at an epoch at least
    ours *fences* the asker: that node may be serving, so the asker steps down.
``takeover`` (a slave that lost its master, for the epoch it would raise to)
    granted only once the holder's lease ran out, never while the holder's last renewal
    said it receipted alone, never for an epoch not newer than the holder's; the
    grant makes the asker the holder (its lease starts now). The asker asks for
    :func:`takeover_epoch`: its own epoch + 1, or the holder's + 1 when the witness
    granted a newer epoch than the asker's store has -- a grant the other node may never
    have used (it agreed to stand by meanwhile). Asking at its own epoch + 1 it would be
    refused for ever, the witness keeping its record: no master again (issue 24).
    Safe: a node that used a grant at epoch ``E`` receipted nothing the asker lacks
    unless it receipted alone (then its last renewal said so, and it is refused) or with
    an in-sync slave -- the asker, whose store then adopted ``E`` already.
``release`` (a master handing over to its in-sync slave: it stops, or its journal failed)
    the holder gives its lease back: the record says "not alone" and the lease has run
    out, so the slave it hands over to is granted mastership at once instead of waiting
    out a lease nobody uses (issue 24). The master sends it after its last receipt alone
    (it stops counting on its lease first) and before the handover frame; it renews
    nothing after it. From anyone else, or at an older epoch, it changes nothing.

A node counts its lease from the moment it *sent* the renewal, the witness from the
moment it got it, so the node's lease always runs out first (a margin covers clock
rates). Hence: a slave is granted mastership only when the master's own view of its
lease has run out, and a master whose lease ran out receipts nothing alone
(:attr:`.replication.ReplicationMaster.lease_until`).

Durability. Every field but ``expires`` is written (fsync'd, write-then-rename) before
an answer that changed it is sent; a restarted witness, not knowing when a lease was
last renewed, counts every lease as renewed at its start (:func:`restored`), so it
never grants a second node what the first may still hold.

A pair is known by its id, ``sha256(key)``, where ``key`` is derived from the pair's
cluster secret (:func:`pair_key`): one witness serves any number of pairs and holds
no secret it was not given by the pair itself (trust on first use: the first request
of an unknown pair carries its key, which the witness checks against the id and
keeps; every later request is signed with it, :mod:`.auth`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

__all__ = [
    "MAX_LEASE",
    "MIN_LEASE",
    "PairLease",
    "Verdict",
    "dump_state",
    "load_state",
    "pair_id",
    "pair_key",
    "parse_request",
    "release",
    "renew",
    "restored",
    "takeover",
    "takeover_epoch",
]

MIN_LEASE = 0.05
MAX_LEASE = 600.0
STATE_VERSION = 1


def pair_key(secret: bytes) -> str:
    """The key a pair signs its witness requests with (hex), derived from its cluster secret."""
    return hmac.new(secret, b"amq-witness-key", hashlib.sha256).hexdigest()


def pair_id(key: str) -> str:
    """The id a pair is known by at the witness: it names the key without revealing it."""
    return hashlib.sha256(key.encode("ascii")).hexdigest()[:32]


@dataclass(frozen=True)
class PairLease:
    """What the witness keeps of one pair (durable: everything but ``expires``)."""

    key: str
    holder: str = ""  # the node granted mastership last ("" none yet)
    epoch: int = 0  # the epoch it was granted (or renewed) at
    alone: bool = False  # its last renewal: receipting without an in-sync slave
    lease: float = 0.0  # seconds a renewal lasts
    expires: float = 0.0  # the witness's monotonic time the lease runs out (memory only)

    def remaining(self, now: float) -> float:
        return max(0.0, self.expires - now) if self.holder else 0.0


@dataclass(frozen=True)
class Verdict:
    """The answer to one request: ``lease`` is the pair's record afterwards; write it
    before answering when ``changed``; ``fence``: the asker must step down."""

    granted: bool
    reason: str
    lease: PairLease
    changed: bool = False
    fence: bool = False


def _durable(p: PairLease) -> tuple[str, str, int, bool, float]:
    return p.key, p.holder, p.epoch, p.alone, p.lease


def _grant(p: PairLease, node: str, epoch: int, alone: bool, lease: float, now: float, reason: str) -> Verdict:
    new = replace(p, holder=node, epoch=epoch, alone=alone, lease=lease, expires=now + lease)
    return Verdict(True, reason, new, changed=_durable(new) != _durable(p))


def renew(p: PairLease, node: str, epoch: int, alone: bool, lease: float, now: float) -> Verdict:
    """A master renews its lease (see the module docstring)."""
    if p.holder == node:
        if epoch < p.epoch:
            return Verdict(False, f"node {node} holds the lease at epoch {p.epoch}, newer than {epoch}", p, fence=True)
        return _grant(p, node, epoch, alone, lease, now, f"lease renewed for {lease:g} s")
    if not p.holder:
        return _grant(p, node, epoch, alone, lease, now, f"first lease of this pair, for {lease:g} s")
    left = p.remaining(now)
    if epoch <= p.epoch:
        return Verdict(False, f"node {p.holder} was granted mastership at epoch {p.epoch} (yours {epoch}): "
                              "it may be serving; step down", p, fence=True)
    if left > 0:
        return Verdict(False, f"node {p.holder} holds the lease for {left:.1f} s more", p)
    return _grant(p, node, epoch, alone, lease, now, f"lease of node {p.holder} ran out; granted at epoch {epoch}")


def takeover(p: PairLease, node: str, epoch: int, lease: float, now: float) -> Verdict:
    """A slave that lost its master asks to become master at ``epoch`` (see the module docstring)."""
    if not p.holder or (p.holder == node and epoch >= p.epoch):
        return _grant(p, node, epoch, False, lease, now, f"mastership granted at epoch {epoch}")
    left = p.remaining(now)
    if left > 0:
        return Verdict(False, f"the master {p.holder} holds the lease for {left:.1f} s more", p)
    if p.alone:
        return Verdict(False, f"the master {p.holder} receipted without an in-sync slave: this copy may lack "
                              "receipted messages; not granting", p)
    if epoch <= p.epoch:
        return Verdict(False, f"node {p.holder} was granted epoch {p.epoch}, not older than {epoch}", p)
    return _grant(p, node, epoch, False, lease, now,
                  f"the lease of master {p.holder} ran out: mastership granted at epoch {epoch}")


def release(p: PairLease, node: str, epoch: int, now: float) -> Verdict:
    """The holder hands over and gives its lease back (see the module docstring)."""
    if p.holder != node or epoch < p.epoch:
        return Verdict(False, f"node {node} at epoch {epoch} does not hold the lease (holder {p.holder or 'none'} "
                              f"at epoch {p.epoch}): nothing to release", p)
    new = replace(p, alone=False, expires=min(p.expires, now))
    return Verdict(True, f"lease of node {node} released (it hands over to its in-sync slave)", new,
                   changed=_durable(new) != _durable(p))


def takeover_epoch(own: int, recorded: int) -> int:
    """The epoch a node whose store has epoch ``own`` asks mastership at, the witness's
    record being at epoch ``recorded`` (see the module docstring): newer than both."""
    return max(own, recorded) + 1


def restored(p: PairLease, now: float) -> PairLease:
    """A record read back at the witness's start: its lease counts as renewed ``now``."""
    return replace(p, expires=now + p.lease if p.holder else 0.0)


# ---------------------------------------------------------------------- parsing
def parse_request(headers: Mapping[str, str]) -> tuple[int, float, bool]:
    """(epoch, lease seconds, alone) of a request's headers; ValueError naming the bad one."""
    epoch = headers.get("amq-ha-epoch", "")
    if not (epoch.isascii() and epoch.isdigit()) or len(epoch) > 18:
        raise ValueError(f"bad amq-ha-epoch {epoch[:40]!r}: expected a non-negative integer")
    raw = headers.get("amq-witness-lease", "")
    try:
        lease = float(raw)
    except ValueError:
        raise ValueError(f"bad amq-witness-lease {raw[:40]!r}: expected seconds") from None
    if not MIN_LEASE <= lease <= MAX_LEASE:  # also refuses nan and inf
        raise ValueError(f"amq-witness-lease {raw[:40]!r} out of range ({MIN_LEASE:g} to {MAX_LEASE:g} s)")
    alone = headers.get("amq-witness-alone", "false")
    if alone not in ("true", "false"):
        raise ValueError(f"bad amq-witness-alone {alone[:40]!r}: expected true or false")
    return int(epoch), lease, alone == "true"


def dump_state(pairs: Mapping[str, PairLease]) -> bytes:
    """The durable state file's content."""
    data = {"version": STATE_VERSION, "pairs": {
        pid: {"key": p.key, "holder": p.holder, "epoch": p.epoch, "alone": p.alone, "lease": p.lease}
        for pid, p in sorted(pairs.items())
    }}
    return json.dumps(data, indent=1, sort_keys=True).encode("utf-8") + b"\n"


def load_state(raw: bytes, now: float) -> dict[str, PairLease]:
    """The pairs of a state file (:func:`dump_state`), their leases counted as renewed
    ``now``; ValueError naming what is wrong."""
    try:
        data: Any = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("version") != STATE_VERSION or not isinstance(data.get("pairs"), dict):
        raise ValueError(f"expected {{\"version\": {STATE_VERSION}, \"pairs\": {{...}}}}")
    out: dict[str, PairLease] = {}
    for pid, rec in data["pairs"].items():
        if not isinstance(rec, dict):
            raise ValueError(f"pair {pid[:40]!r}: expected an object")
        key, holder, epoch, alone, lease = (rec.get(k) for k in ("key", "holder", "epoch", "alone", "lease"))
        if not isinstance(key, str) or pair_id(key) != pid:
            raise ValueError(f"pair {pid[:40]!r}: its key does not match its id")
        if not isinstance(holder, str) or len(holder) > 200:
            raise ValueError(f"pair {pid[:40]!r}: bad holder")
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"pair {pid[:40]!r}: bad epoch {epoch!r}")
        if not isinstance(alone, bool):
            raise ValueError(f"pair {pid[:40]!r}: bad alone {alone!r}")
        if isinstance(lease, bool) or not isinstance(lease, (int, float)) or not 0 <= lease <= MAX_LEASE:
            raise ValueError(f"pair {pid[:40]!r}: bad lease {lease!r}")
        out[pid] = restored(PairLease(key, holder, epoch, alone, float(lease)), now)
    return out
