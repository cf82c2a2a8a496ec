"""What a master must learn from its peer before it receipts on its own disk alone.

Theory of operation
-------------------
A receipt promises that the message survives the loss of either node, so a master
may receipt a record its slave has not acknowledged only if that slave can never
become master without first resyncing from it. Two events make that doubtful: the
master loses a synced slave without a goodbye (the slave crashed -- or took over),
and the master's event loop stalls for longer than ``--link-timeout`` (the process
was frozen: SIGSTOP, a long pause, a VM freeze; the slave may have taken over in the
meantime and the master has not noticed yet). After either, the
:class:`~.replication.ReplicationMaster` is *suspect*: it runs no completion that a
slave ack does not cover, and the node asks its peer, on every address it knows, to
*stand by* (an ``amq-ha-standby`` request signed with the cluster secret; see
:func:`ask_peer`). :func:`judge` turns the answers into a :class:`Verdict`:

``step-down``
    the peer is master with a newer epoch (it took over while we were frozen or cut
    off), or its synced store is newer than ours: we leave the master role at once;
    the held receipts are never sent, our unreplicated writes are dropped, the
    clients reconnect to the peer and replay (their idempotency keys drop copies).
``demote-peer``
    the peer is master with an older epoch (it came back knowing nothing of us):
    ask it to step down (a demote request) and keep holding.
``clear``
    the peer agreed to stand by (it is not master, its epoch is not newer; from now
    on it will not take over before it has resynced from us: it marks its store
    as no longer a complete copy, in the same loop step as its own takeover
    decision would run, so the two cannot interleave); or it is our attached,
    in-sync slave (its acks still gate every receipt); or every address refuses the
    connection (the peer is not running: a restarted slave waits for its master);
    or we know no peer at all. The master receipts alone again.
``unknown``
    no answer (a frozen or partitioned peer), or one we cannot use: keep holding
    and ask again. A master receipts nothing until it can tell.

The decision is pure (:func:`judge`); :func:`ask_peer` does the asking.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from .wire import (
    STANDBY_ANSWER,
    STANDBY_REASON,
    ReplicaRefused,
    ReplicationError,
    ha_request,
    probe,
)

__all__ = ["PeerAnswer", "Verdict", "ask_peer", "judge"]

CLEAR, STEP_DOWN, DEMOTE_PEER, UNKNOWN = "clear", "step-down", "demote-peer", "unknown"


@dataclass(frozen=True)
class PeerAnswer:
    """What one address of the peer said: its status headers (``info``), or that the
    connection was refused, or an error (no answer in time, an ERROR frame)."""

    address: tuple[str, int]
    info: Mapping[str, str] | None = None
    refused: bool = False
    error: str = ""


@dataclass(frozen=True)
class Verdict:
    kind: str  # clear | step-down | demote-peer | unknown
    reason: str
    address: tuple[str, int] | None = None  # demote-peer: the stale master's HA address
    info: Mapping[str, str] = field(default_factory=dict)


def _epoch(info: Mapping[str, str]) -> int:
    raw = info.get("amq-ha-epoch", "0") or "0"
    return int(raw) if raw.isdigit() else 0


def judge(name: str, epoch: int, answers: Sequence[PeerAnswer], *, in_sync_slave: str | None = None) -> Verdict:
    """The verdict for a master ``name`` at ``epoch`` (see the module docstring).
    ``in_sync_slave``: the name of the slave attached and in sync with us, if any."""
    for answer in answers:
        info = answer.info
        if info is None:
            continue
        theirs, who = _epoch(info), info.get("amq-ha-name", "?")
        where = f"{answer.address[0]}:{answer.address[1]}"
        if info.get("amq-ha-role") == "master":
            if theirs > epoch or (theirs == epoch and who < name):
                return Verdict(STEP_DOWN, f"peer {who} at {where} is master at epoch {theirs} (ours {epoch})",
                               info=info)
            target = answer.address
            ha = info.get("amq-ha-port", "")
            host, sep, port = ha.rpartition(":")
            if sep and host and port.isdigit():
                target = (host.strip("[]"), int(port))
            return Verdict(DEMOTE_PEER, f"peer {who} at {where} is a stale master (epoch {theirs} < ours {epoch})",
                           address=target, info=info)
        standby = info.get(STANDBY_ANSWER)
        if standby == "ok":
            return Verdict(CLEAR, f"peer {who} ({info.get('amq-ha-role')}, epoch {theirs}) stands by", info=info)
        if standby == "in-sync":
            if in_sync_slave == who:
                return Verdict(CLEAR, f"peer {who} is our attached, in-sync slave", info=info)
            return Verdict(UNKNOWN, f"peer {who} still believes it is in sync with us; asking again", info=info)
        if theirs > epoch and info.get("amq-ha-synced") == "true":
            return Verdict(STEP_DOWN, f"peer {who} at {where} holds a newer store (epoch {theirs} > ours {epoch})",
                           info=info)
        why = info.get(STANDBY_REASON) or answer.error or f"it is {info.get('amq-ha-role')}"
        return Verdict(UNKNOWN, f"peer {who} at {where} did not agree to stand by: {why}", info=info)
    if not answers:
        return Verdict(CLEAR, "no peer known")
    if all(a.refused for a in answers):
        where = ", ".join(f"{h}:{p}" for (h, p) in (a.address for a in answers))
        return Verdict(CLEAR, f"the peer is not running (every address refuses: {where})")
    errors = "; ".join(f"{a.address[0]}:{a.address[1]}: {a.error or 'refused'}" for a in answers)
    return Verdict(UNKNOWN, f"the peer does not answer ({errors})")


async def ask_peer(
    addresses: Sequence[tuple[str, int]],
    headers: Callable[[], Mapping[str, str]] | None,
    timeout: float,
) -> list[PeerAnswer]:
    """Ask each address in turn until one answers: a stand-by request built by
    ``headers()`` (freshly signed each time), or a plain status probe when ``headers``
    is None. An ERROR answer is followed by a status probe (is it a master?)."""
    out: list[PeerAnswer] = []
    for addr in addresses:
        if headers is None:
            info = await probe(*addr, timeout=timeout)
            out.append(PeerAnswer(addr, info=info, error="" if info is not None else "no answer"))
        else:
            try:
                frame, _r, writer = await ha_request(*addr, headers(), timeout=timeout)
            except ConnectionRefusedError:
                out.append(PeerAnswer(addr, refused=True))
                continue
            except ReplicaRefused as exc:
                info = await probe(*addr, timeout=timeout)
                out.append(PeerAnswer(addr, info=info, error=f"refused: {exc}"))
            except (OSError, TimeoutError, ReplicationError) as exc:
                out.append(PeerAnswer(addr, error=str(exc) or type(exc).__name__))
                continue
            else:
                writer.close()
                out.append(PeerAnswer(addr, info={k: v for k, v in frame.headers}))
        if out[-1].info is not None:
            break
    return out
