"""Who is master: the decision table of a replicated node, as pure functions.

Theory of operation
-------------------
Every choice a node of a replicated pair makes about its role -- become master, join
a master as slave, wait, take over after losing its master, step down, fence itself,
agree to stand by -- is made here, by :func:`decide` (and :func:`standby`, its
counterpart on the peer), from frozen values: what the node knows of itself
(:class:`NodeState`: its ``ha-state.json`` and the moment), its options
(:class:`DecideOptions`) and what it has observed (:class:`Peers`: the peer's answers
on every address it knows, and whether the ``--takeover-check`` address answers). The
role loop (:mod:`.node`) only observes and acts. When a rule needs an observation the
node has not made yet, the decision says so -- ``ask`` (probe the peer's addresses, or
send them a stand-by request), ``confirm`` (probe them again after the confirmation
delay) or ``check`` (try the takeover-check address) -- and the
node decides again with the answer and its state as it is *after* the last await: a
stand-by request accepted meanwhile (it runs on the same loop) is always seen, and a
node raises its epoch with nothing awaited between the decision and the raise.

The table. ``phase`` says which situation the node decides in: ``start`` (not serving
and no link: at start, after a wait, after leaving the master role), ``link-lost`` (a
slave whose replication link broke), ``master`` (a master with no slave attached
probes its peer every second; a *suspect* master -- see :mod:`.replication` -- asks it
to stand by until it can tell), ``slave-lost`` (a master's slave link ended) and
``stand-by`` (the answer to a stand-by request, :func:`standby`). In each phase the
first row whose conditions all hold decides. "The peer" is the first of the peer's
addresses that answers; in ``start`` a master answering on any address wins.
``master (checked)`` means: with ``--takeover-check``, ``check`` while it has not
been tried, and ``wait`` while it does not answer; then, with ``--witness``,
``ask-witness`` (for mastership at its epoch + 1, or the witness's epoch + 1 when
newer: :func:`.lease.takeover_epoch`) while it has not been asked, and
``wait`` while it does not grant it; else ``master``. A claim is (the
store's epoch if it is synced, else -1; an undamaged journal; last role master;
configured as master), compared in that order; equal claims go to the lower name. A
node whose journal reads back damaged or missing records (``damaged``: the node reads
it before it claims anything) so never serves it over a peer holding an undamaged
copy of the same epoch: that peer becomes master and the damaged node resyncs from it
(row 2); against a peer with an older epoch, or none, its copy is still the best. A master that is not
suspect acts on ``step-down`` and ``demote-peer`` only.
docs/ha.md shows the same table; ``tests/ha/test_decide.py`` checks every
combination of inputs against it.

| phase | # | when | then |
|---|---|---|---|
| start | 1 | not asked | ask |
| start | 2 | an address answers as master | join |
| start | 3 | store not synced | wait |
| start | 4 | the peer answers; its claim is better | wait |
| start | 5 | the peer answers | master (checked) |
| start | 6 | last role slave; master strict | master (checked) |
| start | 7 | last role slave | wait |
| start | 8 | a slave synced from us | wait |
| start | 9 | configured as master | master (checked) |
| start | 10 | last role master | master (checked) |
| start | 11 | otherwise | wait |
| link-lost | 1 | store not synced | retry |
| link-lost | 2 | shutdown on master failure | cold-backup |
| link-lost | 3 | the master did not hand over; not asked | ask |
| link-lost | 4 | the master did not hand over; an address answers as master | relink |
| link-lost | 5 | takeover check not tried | check |
| link-lost | 6 | takeover check unreachable | isolated |
| link-lost | 7 | no witness; the master handed over | master |
| link-lost | 8 | no witness; not asked again | confirm |
| link-lost | 9 | no witness; an address answers as master again | relink |
| link-lost | 10 | no witness | master |
| link-lost | 11 | the witness not asked | ask-witness |
| link-lost | 12 | the witness grants | master |
| link-lost | 13 | otherwise | isolated |
| master | 1 | the witness not asked | ask-witness |
| master | 2 | the witness grants | lease |
| master | 3 | not asked | ask |
| master | 4 | the peer is master; its epoch is newer | step-down |
| master | 5 | the peer is master; same epoch; its name is lower | step-down |
| master | 6 | the peer is master | demote-peer |
| master | 7 | the peer stands by | clear |
| master | 8 | the peer says in-sync; it is our in-sync slave | clear |
| master | 9 | the peer says in-sync | hold |
| master | 10 | the peer's synced store is newer | step-down |
| master | 11 | the peer answers | hold |
| master | 12 | no peer known | clear |
| master | 13 | every address refuses; held within the refusal window | clear |
| master | 14 | no witness | hold |
| master | 15 | otherwise | hold |
| slave-lost | 1 | the slave said goodbye | forget |
| slave-lost | 2 | the slave was not in sync | serve |
| slave-lost | 3 | shutdown on slave failure | stop |
| slave-lost | 4 | takeover check not tried | check |
| slave-lost | 5 | takeover check unreachable | fence |
| slave-lost | 6 | otherwise | serve |
| stand-by | 1 | this node is master | refused |
| stand-by | 2 | store synced; its epoch is newer than the requester's | refused |
| stand-by | 3 | our link to the requester is up and in sync | in-sync |
| stand-by | 4 | store synced; master strict | ok |
| stand-by | 5 | store synced | ok-unsynced |
| stand-by | 6 | otherwise | ok |

What the outcomes do: ``join`` (become the slave of the master at
:attr:`Decision.address`: its HA port, or the master connector when that is where it
answered), ``master`` (raise the epoch and serve), ``wait`` (role ``waiting``, decide
again after a pause), ``retry`` (decide again from ``start`` after a pause),
``cold-backup`` (stop, keeping the copy), ``relink`` (stay slave: the master is alive;
link again), ``isolated`` (stay slave and probe again: this node may be the cut-off
one), ``step-down`` (leave the master role; the held receipts are never sent, the
clients replay to the peer), ``demote-peer`` (send the stale master at
:attr:`Decision.address` a demote request and keep holding), ``clear`` (receipt alone
again), ``hold`` (keep holding receipts, ask again), ``forget`` (the slave left
cleanly: it will not take over, so a restart may serve alone), ``serve`` (nothing to
do), ``stop`` (exit code 3), ``fence`` (close the client port, decide again),
``ask-witness`` (ask the witness, ``--witness``: a slave for mastership at its epoch + 1,
a master to renew its lease saying it receipts alone; :mod:`.witness`), ``lease`` (receipt
alone again while the witness renews the lease, and hold again the moment it runs out),
``confirm`` (probe the master's addresses again after
:attr:`DecideOptions.confirm_delay`: a refusal is proof of a dead master only when it
persists, see "Refusals" below), ``refused`` / ``in-sync`` / ``ok`` (the stand-by answers; ``ok-unsynced`` is ``ok``
and this store is no longer a complete copy: it resyncs before it could take over).

Refusals. Without a witness, a refused connection is the only proof that the peer's
process is not running, and a live master refuses for a moment: a suspect master closes
its client port while it decides (:mod:`.master`), and a firewall may reset the HA ports
alone (a cut of the replication link with TCP resets). Were both taken at once as proof
-- the master finding every address of its cut-off slave refusing (a slave has no client
port) and receipting alone, the slave finding the master's HA port reset and its client
port closed and taking over -- there would be two masters. So the two sides wait
differently: a master clears on refusals only within the *refusal window* ``R``
(:attr:`DecideOptions.refusal_window`, ``min(1 s, --link-timeout)``) after its
receipts began to be held (``NodeState.held_for``; later rounds hold, or ask the
witness; after a stall of its own loop, from the stall's start: its slave may have
taken over and died meanwhile); a master that clears reopens its client port at once, so a live master's
client port refuses for at most ``R`` plus a bind in a row unless it holds -- and a
master that holds past ``R`` never receipts alone on a refusal. Without a witness the
slave takes over only if a second probe, :attr:`DecideOptions.confirm_delay` (``2 R``)
after the first, finds no master either (whatever the first found: a refusal, or a
timeout on one address and a refusal on another). What the pair then still assumes --
a refused connection on *every* address of a node means its process is not running --
is in docs/ha.md.

Handovers. Only a crash pays that delay. A master that leaves its role on purpose with
an in-sync slave attached -- it stops (SIGTERM), or its journal failed and it fences
itself (:mod:`.master`) -- hands over explicitly: after its last receipt and before it
closes the link it sends a ``HANDOVER`` frame on the replication link (:mod:`.wire`), a
request signed with the cluster secret like every role-changing request (:mod:`.auth`),
naming the master and its epoch and answering the challenge the slave put in its
replication ``CONNECT`` (so it is good on that one link only). A slave whose link ended
with a handover it verified (``NodeState.handed_over``: the signature, the master's name,
the epoch it synced at) neither probes the master (whose HA port may still answer
``master`` for a moment while it stops) nor confirms: it takes over at once (link-lost
row 7). A forged, replayed or garbled handover is a broken link: the crash rows decide.

Why: a receipt promises that the message survives the loss of either node, so no
rule may let a node serve a store that could lack a receipted message, and a master
receipts on its own disk alone only once its peer can no longer take over without
resyncing from it (the peer stood by, or it is not running). The partition cases (M =
master, S = slave, C = the takeover-check address):

1. M's process dies (crash, SIGKILL): the link gets EOF at once, every M address
   refuses, C answers -> S takes over (epoch + 1). No loss: every receipt was on S's
   disk.
2. M's host or network dies silently: no ack/ping for ``--link-timeout`` (default
   2 s) -> S probes M (times out) -> C answers -> S takes over.
3. M is frozen (SIGSTOP, a long pause, a VM freeze) longer than ``--link-timeout``:
   as case 2, S takes over. When M resumes, its overdue timers see the link gone (or
   the loop stall): it cuts the clients whose receipts waited for S, asks S to stand
   by, finds S master at a newer epoch and steps down, resyncing from S. No loss: M
   never receipts what S lacks (the SENDs that reached M while it was frozen are
   replayed by their clients to S).
4. Only the replication link is cut (a proxy between them dies), M is alive:
   M drops S after ``--link-timeout`` without an ack, cuts the clients whose receipts
   waited for S, and asks S (on S's own address) to stand by; S agrees (its copy is
   stale from now on) and M serves alone (or stops with
   ``--shutdown-on-slave-failure``). S sees the link go, probes M's own client/HA
   address, gets an answer, and stays slave, retrying the link every interval; when
   it comes back S resyncs. No second master, no loss.
5. S is isolated, frozen, or its host hangs: S cannot reach M nor C -> S does not take
   over; it retries. M cannot tell this from S having taken over, so it receipts
   nothing (SENDs wait for their receipts) until S answers again or its ports refuse
   (S's process is gone: a restarted slave waits for its master), or an operator
   declares S gone (``amq broker release``: a signed ``amq-ha-release`` request); or
   it stops with ``--shutdown-on-slave-failure``.
6. M is isolated (M cannot reach S nor C; S reaches C): S takes over. M holds its
   receipts (case 5); when its synced slave is lost and ``--takeover-check`` is set on
   M too, it tests C, cannot reach it, and *fences itself*: it closes its client port
   and every client and goes back to deciding (``start``, row 2: it joins S as
   slave when the network heals). Without ``--takeover-check`` on M, M keeps its
   client port open (holding receipts) until it sees S as a master with a higher epoch.
7. M and S cannot reach each other at all but both reach C (the residual case no
   two-node design without a quorum can settle): S takes over; M holds every receipt
   (it cannot ask S to stand by), so clients still connected to M see their sends
   wait rather than a receipt. When the partition heals, M sees S as master with a
   higher epoch and steps down; its clients replay to S. No receipted message is lost;
   availability is what is given up (the CP choice).
8. Both nodes die and only the stale one (the old master, whose slave had synced)
   restarts: it waits for its peer instead of serving stale data (``start``, row 8).
   Delete ``ha-state.json`` on it to force it up if the other node's disk is lost for
   good.
9. With a witness (``--witness``, :mod:`.witness`), cases 5 and 7 change: in case 5 the
   master asks the witness (``ask-witness``) and receipts alone while it renews the
   master's lease (``lease``), which it does only while it has granted the slave
   nothing. It asks the witness *first*, before the peer (``master`` rows 1-2): a
   peer behind a link that drops packets answers nothing for the whole ask, the
   witness at once; the renewal says whether the master receipts alone by the same test
   as its periodic renewals (no in-sync slave attached), and counts only if that still
   holds when the answer comes (:meth:`.node.HaNode.decide_observing`); in case 7 the slave takes over only with the witness's grant, given once
   the master's lease ran out unrenewed -- so only when the master cannot reach the
   witness either, and then it holds its receipts. docs/ha.md has the table of who may
   serve for each link down (master-slave, master-witness, slave-witness).
10. M stops (SIGTERM) or fences itself (its journal failed) with S in sync: M sends a
    signed handover after its last receipt and closes the link; S takes over at once,
    without probing M (case 1 without the wait: "Handovers" above). No loss: every
    receipt was on S's disk, and M receipts nothing after the handover.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal, TypeGuard, get_args

from .config import HaOptions, parse_address

__all__ = [
    "Action",
    "CONFIRM",
    "Decision",
    "DecideOptions",
    "NodeState",
    "PeerAnswer",
    "Peers",
    "Phase",
    "decide",
    "says_master",
    "standby",
    "ACTIONS",
    "PHASES",
]

#: which table a node decides in (module docstring)
Phase = Literal["start", "link-lost", "master", "slave-lost", "stand-by"]
#: what a decision says to do (module docstring: "What the outcomes do")
Action = Literal[
    "ask", "check", "confirm",
    "join", "master", "wait", "retry",
    "cold-backup", "relink", "isolated",
    "step-down", "demote-peer", "clear", "hold",
    "forget", "serve", "stop", "fence",
    "refused", "in-sync", "ok", "ok-unsynced",
    "ask-witness", "lease",
]
PHASES: tuple[Phase, ...] = get_args(Phase)
ACTIONS: tuple[Action, ...] = get_args(Action)

# phases (which table)
START: Final = "start"
LINK_LOST: Final = "link-lost"
MASTER: Final = "master"
SLAVE_LOST: Final = "slave-lost"
STAND_BY: Final = "stand-by"

# outcomes
ASK: Final = "ask"
CHECK: Final = "check"
CONFIRM: Final = "confirm"
JOIN: Final = "join"
BECOME_MASTER: Final = "master"
WAIT: Final = "wait"
RETRY: Final = "retry"
COLD_BACKUP: Final = "cold-backup"
RELINK: Final = "relink"
ISOLATED: Final = "isolated"
STEP_DOWN: Final = "step-down"
DEMOTE_PEER: Final = "demote-peer"
CLEAR: Final = "clear"
HOLD: Final = "hold"
FORGET: Final = "forget"
SERVE: Final = "serve"
STOP: Final = "stop"
FENCE: Final = "fence"
REFUSED: Final = "refused"
IN_SYNC: Final = "in-sync"
OK: Final = "ok"
OK_UNSYNCED: Final = "ok-unsynced"
ASK_WITNESS: Final = "ask-witness"
LEASE: Final = "lease"


@dataclass(frozen=True)
class NodeState:
    """What the node knows of itself when it decides: its ``ha-state.json``
    (:class:`~.epoch.HaState`) and the moment."""

    phase: Phase
    epoch: int = 0
    synced: bool = True  # the store is a complete copy
    last_role: str = "none"  # ha-state.json's role: master, slave or none
    peer_may_be_master: bool = False  # a slave synced from us (it could take over)
    master_strict: bool = False  # our master runs --shutdown-on-slave-failure
    role: str = "starting"  # the role now (stand-by)
    linked_to: str | None = None  # the peer whose replication link with us is up and in sync
    goodbye: bool = False  # slave-lost: the slave said goodbye
    slave_was_synced: bool = False  # slave-lost: that slave was in sync
    damaged: bool = False  # its journal reads back damaged or missing records (salvage.verify)
    handed_over: bool = False  # link-lost: the master handed over on the link (signed, at our epoch)
    held_for: float = 0.0  # master: seconds since its receipts began to be held (suspect), now


@dataclass(frozen=True)
class DecideOptions:
    """The options the table reads (from :class:`~.config.HaOptions`)."""

    name: str
    master_connector: str | None = None
    takeover_check: tuple[str, int] | None = None
    shutdown_on_master_failure: bool = False
    shutdown_on_slave_failure: bool = False
    witness: tuple[str, int] | None = None
    #: a suspect master clears on refusals only this long (s) after its receipts began to
    #: be held: ``min(1 s, --link-timeout)``, one probe's timeout (module docstring, "Refusals")
    refusal_window: float = 1.0

    @property
    def confirm_delay(self) -> float:
        """How long (s) after its first probe a slave without a witness probes its lost
        master again before taking over: longer than a live master's client port can
        refuse in a row while it does not hold (the refusal window, then a bind)."""
        return 2 * self.refusal_window

    @classmethod
    def of(cls, name: str, opts: HaOptions) -> DecideOptions:
        check = parse_address(opts.takeover_check, "--takeover-check") if opts.takeover_check else None
        witness = parse_address(opts.witness, "--witness") if opts.witness else None
        return cls(name, opts.master_connector, check, opts.shutdown_on_master_failure,
                   opts.shutdown_on_slave_failure, witness, min(1.0, opts.link_timeout))


@dataclass(frozen=True)
class PeerAnswer:
    """What one address of the peer said: its status headers (``info``), or that the
    connection was refused, or an error (no answer in time, an ERROR frame); to a
    stand-by request, its answer (``standby``: ok, in-sync or refused) and why."""

    address: tuple[str, int]
    info: Mapping[str, str] | None = None
    refused: bool = False
    error: str = ""
    standby: str | None = None
    standby_reason: str = ""


def says_master(info: Mapping[str, str] | None) -> TypeGuard[Mapping[str, str]]:
    """Status headers (``info``; None: no answer) of a node that is master."""
    return info is not None and info.get("amq-ha-role") == "master"


@dataclass(frozen=True)
class Peers:
    """What the node observed: the answers of the peer's addresses, in the order it
    asked them (None: not asked yet), whether the takeover-check address answered
    a TCP connect (None: not tried), and whether the witness granted what it was asked
    (None: not asked; ``witness_reason``: what it said); ``again``: the answers of the
    second probe, made :attr:`DecideOptions.confirm_delay` after the first (None: not
    made)."""

    answers: tuple[PeerAnswer, ...] | None = None
    check: bool | None = None
    witness: bool | None = None
    witness_reason: str = ""
    again: tuple[PeerAnswer, ...] | None = None


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    address: tuple[str, int] | None = None  # join: the master; demote-peer: the stale master
    info: Mapping[str, str] = field(default_factory=dict)  # the answer that decided, if any


def decide(state: NodeState, options: DecideOptions, peers: Peers) -> Decision:
    """The row of the table (module docstring) for ``state.phase`` that matches first."""
    if state.phase == START:
        return _start(state, options, peers)
    if state.phase == LINK_LOST:
        return _link_lost(state, options, peers)
    if state.phase == MASTER:
        return _master(state, options, peers)
    if state.phase == SLAVE_LOST:
        return _slave_lost(state, options, peers)
    raise ValueError(f"no decision table for phase {state.phase!r} (stand-by requests: standby())")


def standby(state: NodeState, options: DecideOptions, requester: str, epoch: int) -> Decision:
    """The answer to a stand-by request from master ``requester`` at ``epoch`` (the
    ``stand-by`` rows of the table)."""
    if state.role == "master":
        return Decision(REFUSED, f"node {options.name} is master at epoch {state.epoch}")
    if state.synced and state.epoch > epoch:
        return Decision(REFUSED, f"this store has epoch {state.epoch}, newer than {epoch}")
    if state.linked_to is not None and state.linked_to == requester:
        return Decision(IN_SYNC, f"in sync with {requester}")
    if state.synced and not state.master_strict:
        return Decision(OK_UNSYNCED, "standing by")
    return Decision(OK, "standing by")


# ---------------------------------------------------------------------- the phases
def _epoch(info: Mapping[str, str]) -> int:
    raw = info.get("amq-ha-epoch", "0") or "0"
    return int(raw) if raw.isdigit() else 0


def _address(text: str) -> tuple[str, int] | None:
    host, sep, port = text.rpartition(":")
    if sep and host and port.isdigit():
        return host.strip("[]"), int(port)
    return None


def _checked(options: DecideOptions, peers: Peers, reason: str, *,
             unreachable: Literal["wait", "isolated"] = WAIT) -> Decision:
    """``master``, once the takeover-check address (if any) has answered."""
    check = options.takeover_check
    if check is None:
        return Decision(BECOME_MASTER, reason)
    if peers.check is None:
        return Decision(CHECK, f"{reason}; trying the takeover check {check[0]}:{check[1]} first")
    if not peers.check:
        if unreachable == ISOLATED:
            return Decision(ISOLATED, f"master unreachable but so is the takeover check {check[0]}:{check[1]}: "
                                      "this node may be the isolated one; not taking over")
        return Decision(WAIT, f"takeover check {check[0]}:{check[1]} unreachable: not becoming master")
    return Decision(BECOME_MASTER, reason)


def _granted(options: DecideOptions, peers: Peers, reason: str) -> Decision:
    """``master (checked)`` of the ``start`` rows: the takeover check, then the witness's
    grant (a node starting may be cut from a master that serves on its lease: only the
    witness knows)."""
    checked = _checked(options, peers, reason)
    if checked.action != BECOME_MASTER or options.witness is None:
        return checked
    if peers.witness is None:
        return Decision(ASK_WITNESS, f"{reason}; asking the witness for mastership first")
    if peers.witness:
        return Decision(BECOME_MASTER, f"{reason}; the witness grants mastership: {peers.witness_reason}")
    return Decision(WAIT, f"{reason}, but the witness does not grant mastership (yet): {peers.witness_reason}")


def _start(state: NodeState, options: DecideOptions, peers: Peers) -> Decision:
    if peers.answers is None:
        return Decision(ASK, "probing every address known for the peer")
    infos = [a for a in peers.answers if a.info is not None]
    for a in infos:
        assert a.info is not None
        if says_master(a.info):
            # join through the master connector when it names this master, else its HA port
            where = a.address
            if not (options.master_connector and parse_address(options.master_connector) == a.address):
                where = _address(a.info.get("amq-ha-port", "")) or a.address
            return Decision(JOIN, f"master {a.info.get('amq-ha-name')} answers on {a.address[0]}:{a.address[1]}",
                            address=where, info=a.info)
    if not state.synced:
        return Decision(WAIT, "store not synced: waiting for a master to sync from")
    if infos:
        info = infos[0].info
        assert info is not None
        mine = (state.epoch, not state.damaged, state.last_role == "master", not options.master_connector)
        theirs = (
            _epoch(info) if info.get("amq-ha-synced") == "true" else -1,
            info.get("amq-ha-damaged") != "true",
            info.get("amq-ha-last-role") == "master",
            info.get("amq-ha-configured") == "master",
        )
        if mine > theirs or (mine == theirs and options.name < info.get("amq-ha-name", "")):
            return _granted(options, peers, f"peer {info.get('amq-ha-name')} answers; this node has the better "
                                            f"claim (epoch {state.epoch}, the peer's {theirs[0]})")
        why = "; this journal is damaged" if state.damaged and mine[0] == theirs[0] else ""
        return Decision(WAIT, f"peer {info.get('amq-ha-name')} has the better claim (epoch {theirs[0]}{why})",
                        info=info)
    if state.last_role == "slave":
        if state.master_strict:
            # that master (--shutdown-on-slave-failure) never receipted without our ack:
            # this synced copy has every receipted message; it stopped or is gone
            return _granted(options, peers, "master unreachable; it never receipts without this copy "
                                            "(--shutdown-on-slave-failure): taking over")
        return Decision(WAIT, "peer unreachable; this store is a slave's copy and the master may have receipted "
                              "messages it lacks: waiting for the master")
    if state.peer_may_be_master:
        return Decision(WAIT, "peer unreachable and it may hold newer data (it had synced from us): waiting for it")
    if not options.master_connector:
        return _granted(options, peers, "peer unreachable; configured as master")
    if state.last_role == "master":
        return _granted(options, peers, "peer unreachable; this node was master last")
    return Decision(WAIT, f"waiting for master {options.master_connector}")


def _link_lost(state: NodeState, options: DecideOptions, peers: Peers) -> Decision:
    if not state.synced:
        return Decision(RETRY, "this store is not a complete copy (the full sync had not completed, or it agreed "
                               "to stand by): not taking over")
    if options.shutdown_on_master_failure:
        return Decision(COLD_BACKUP, "--shutdown-on-master-failure: not taking over, stopping as a cold backup "
                                     "(the store holds a complete copy)")
    if not state.handed_over:
        if peers.answers is None:
            return Decision(ASK, "probing the master's addresses")
        for a in peers.answers:
            if says_master(a.info):
                return Decision(RELINK, f"replication link lost but the master answers on "
                                        f"{a.address[0]}:{a.address[1]}: not taking over; re-linking",
                                address=a.address, info=a.info)
    lost = "the master handed over" if state.handed_over else "master lost"
    checked = _checked(options, peers, f"{lost}: taking over", unreachable=ISOLATED)
    if checked.action != BECOME_MASTER:
        return checked
    if options.witness is None:
        if state.handed_over:
            return Decision(BECOME_MASTER, "the master handed over (a signed handover on the replication link, "
                                           f"at epoch {state.epoch}): taking over at once")
        if peers.again is None:
            return Decision(CONFIRM, f"master lost: probing its addresses again in {options.confirm_delay:g} s "
                                     "before taking over (a live master may refuse for a moment)")
        for a in peers.again:
            if says_master(a.info):
                return Decision(RELINK, f"replication link lost but the master answers again on "
                                        f"{a.address[0]}:{a.address[1]}: not taking over; re-linking",
                                address=a.address, info=a.info)
        return checked
    if peers.witness is None:
        return Decision(ASK_WITNESS, "master lost: asking the witness for mastership")
    if peers.witness:
        return Decision(BECOME_MASTER, f"master lost and the witness grants mastership: {peers.witness_reason}")
    return Decision(ISOLATED, f"master unreachable and the witness does not grant mastership (yet): "
                              f"{peers.witness_reason}")


def _master(state: NodeState, options: DecideOptions, peers: Peers) -> Decision:
    if options.witness is not None and peers.witness is None:
        return Decision(ASK_WITNESS, "receipts held: asking the witness to renew our lease first")
    if peers.witness:
        return Decision(LEASE, f"the witness renews our lease (it grants the peer nothing meanwhile): "
                               f"{peers.witness_reason}")
    if peers.answers is None:
        return Decision(ASK, "asking the peer")
    name, epoch = options.name, state.epoch
    for answer in peers.answers:
        info = answer.info
        if info is None:
            continue
        theirs, who = _epoch(info), info.get("amq-ha-name", "?")
        where = f"{answer.address[0]}:{answer.address[1]}"
        if says_master(info):
            if theirs > epoch or (theirs == epoch and who < name):
                return Decision(STEP_DOWN, f"peer {who} at {where} is master at epoch {theirs} (ours {epoch})",
                                info=info)
            target = _address(info.get("amq-ha-port", "")) or answer.address
            return Decision(DEMOTE_PEER, f"peer {who} at {where} is a stale master (epoch {theirs} < ours {epoch})",
                            address=target, info=info)
        if answer.standby == OK:
            return Decision(CLEAR, f"peer {who} ({info.get('amq-ha-role')}, epoch {theirs}) stands by", info=info)
        if answer.standby == IN_SYNC:
            if state.linked_to == who:
                return Decision(CLEAR, f"peer {who} is our attached, in-sync slave", info=info)
            return Decision(HOLD, f"peer {who} still believes it is in sync with us; asking again", info=info)
        if theirs > epoch and info.get("amq-ha-synced") == "true":
            return Decision(STEP_DOWN, f"peer {who} at {where} holds a newer store (epoch {theirs} > ours {epoch})",
                            info=info)
        why = answer.standby_reason or answer.error or f"it is {info.get('amq-ha-role')}"
        return Decision(HOLD, f"peer {who} at {where} did not agree to stand by: {why}", info=info)
    if not peers.answers:
        return Decision(CLEAR, "no peer known")
    if all(a.refused for a in peers.answers) and state.held_for <= options.refusal_window:
        where = ", ".join(f"{h}:{p}" for (h, p) in (a.address for a in peers.answers))
        return Decision(CLEAR, f"the peer is not running (every address refuses: {where})")
    errors = "; ".join(f"{a.address[0]}:{a.address[1]}: {a.error or 'refused'}" for a in peers.answers)
    if all(a.refused for a in peers.answers):
        errors += (f"; held {state.held_for:.1f} s, past the {options.refusal_window:g} s refusal window: "
                   "a refusal no longer proves the peer stopped")
    if options.witness is None:
        return Decision(HOLD, f"the peer does not answer ({errors})")
    return Decision(HOLD, f"the peer does not answer ({errors}) and the witness does not renew our lease: "
                          f"{peers.witness_reason}")


def _slave_lost(state: NodeState, options: DecideOptions, peers: Peers) -> Decision:
    if state.goodbye:
        return Decision(FORGET, "the slave said goodbye: it will not take over")
    if not state.slave_was_synced:
        return Decision(SERVE, "the slave was not in sync: it cannot take over")
    if options.shutdown_on_slave_failure:
        return Decision(STOP, "slave lost and --shutdown-on-slave-failure is set: stopping")
    check = options.takeover_check
    if check is None:
        return Decision(SERVE, "slave lost: serving alone once the peer stands by")
    if peers.check is None:
        return Decision(CHECK, "slave lost: trying the takeover check")
    if not peers.check:
        return Decision(FENCE, f"slave lost and the takeover check {check[0]}:{check[1]} is unreachable: this master "
                               "may be the isolated one; fencing (closing the client port) to avoid a split brain")
    return Decision(SERVE, f"slave lost, takeover check {check[0]}:{check[1]} reachable: serving alone")
