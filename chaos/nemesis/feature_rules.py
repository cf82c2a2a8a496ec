"""The checker's rules for the ActiveMQ features (scheduled, prioritized, grouped, selected messages).

Theory of operation
-------------------
:func:`check_features` runs inside :func:`chaos.nemesis.checker.check` (same history,
same violation records and excerpts); like the rest of the checker it reads nothing but
the history. What a producer asked for on a message is its ``props`` record
(:class:`~chaos.nemesis.history.MessageProps`, written by :mod:`chaos.nemesis.features`).
Scheduled and prioritized messages go to ordinary subscribers, so the general rules
(``lost``, ``duplicate``, ``redelivered-after-ack``) judge "delivered once" for them;
grouped messages go to competing consumers, and selected messages to a selective
subscriber or, at the end, its drain: judged here.

``scheduled-early``
    no copy of a message sent with ``AMQ_SCHEDULED_DELAY`` d reaches any consumer's
    wire before ``t + d`` (``t``: when the client started the SEND; the broker counts
    the delay from when it got it, later). Always, faults or not: a takeover or a
    restart keeps the due time (it is in the job's record).
``scheduled-late``
    its first delivery to each subscriber (its first copy on that consumer's wire: when the
    broker handed it out, not when the application thread took it from the client's
    buffer) comes by ``t_done + d + SCHEDULED_SLACK_S``
    (``t_done``: the receipt) -- "on time, give or take the takeover": when a fault
    was active during the message's life, the bound moves to that fault's end plus
    ``TAKEOVER_S`` (or the round's time to health, if longer) plus the slack. An
    *outage* does the same without a fault: a stretch of at least ``OUTAGE_MIN_S`` in
    which no node answered a single client-port probe (a CPU-starved machine: the
    master's process got no time for seconds, its receipts, deliveries and probe answers
    all stop and resume together) moves the bound to the outage's end plus the slack.
    Such messages are counted (``scheduled_late_outage``): the broker's timetable is not
    to blame for seconds it was not run.
``priority-order``
    each batch of :class:`~chaos.nemesis.features.PriorityBacklog` was receipted in
    full before the SUBSCRIBE that drains it; among the batch's messages whose *first*
    delivery came on the same link (one uninterrupted consumer session on one broker),
    the order of first deliveries is priority descending, send order within a priority.
    Nothing is promised across a failover (a message handed out before it comes back
    redelivered, in its own place) -- those pairs are not compared.
``group-lost`` / ``group-duplicate``
    a receipted message with a ``JMSXGroupID`` reached the application of one of the
    consumers sharing its queue (complete history only); it reached a second one only
    if the first one's ACK of it was not yet known durable (a sync receipted on the
    same link after it) when the second one's copy came in on its wire -- otherwise
    ``group-duplicate``. (A copy received before its link died may reach the
    application seconds later, from the client's buffer, after the broker gave the
    message to another consumer and that one acked it: at-least-once, not a duplicate.) (The
    general ``duplicate`` rule already says each consumer got it at most once.)
``group-split``
    a group's messages go to one consumer at a time between consumer changes: a
    violation is a message of group G on consumer Y's wire at ``t2`` while another
    consumer X, which got a message of G at ``t1 < t2``, was still on the *same* link
    after ``t2`` (a later delivery on it) and Y's link was the same since before
    ``t1`` -- neither consumer changed, yet the group moved. A change with a fault
    active between ``t1`` and X's later delivery is *excused* (a toxic can hold frames
    the broker wrote before it gave X's group away), counted in the stats. Two links'
    reader threads do not order their frames (the client read X's copy first though
    the broker wrote Y's first), so a change is *reordered* -- judged as Y's before
    X's, i.e. from the owner before X to Y -- when the links prove it: X's link got,
    before or as its first message of G, a message Y's link had had (a message leaves
    a link only when the link closes: the workload's consumers neither NACK nor
    unsubscribe, and X's link went on), Y moved to a later link, and nothing causal
    shows the broker serving Y's link after X had G (no message on it *sent*, no sync
    *begun* and receipted on it, after X's first message of G came in; the harness
    has one clock). Then Y's link closed after it got G and before X got G: the
    broker dropped Y (a batch of silent clients dropped together, issue 22) and moved
    G on. A split with either link going on stays a violation.
``selector-lost``
    the selector feature (:class:`~chaos.nemesis.features.SelectorProducer`): a
    receipted message whose ``k`` is ``hit`` reached the application of every
    subscriber of its queue with a selector (``k = 'hit'``), and one whose ``k`` is
    ``miss`` reached the application of a subscriber of the queue without one (the
    drain at the end) -- a miss the selective consumer passed over is still there.
    Complete history only, like ``lost`` (which leaves these messages to this rule).
``selector-miss-delivered``
    no copy of a ``miss`` ever reaches the wire of a subscriber with a selector,
    receipted or not, faults or not.
``selector-duplicate``
    a selected message reached a second subscriber of its queue (a hit the drain got
    too) only if the first one's ACK of it was not yet known durable when the second
    one's copy came in on its wire (the rule of ``group-duplicate``); each subscriber
    getting it at most once is the general ``duplicate`` rule, an ACK's durability
    ``redelivered-after-ack``.

Stats: ``scheduled_sent`` / ``scheduled_delivered``, ``scheduled_late_outage`` (past
the slack but within an outage's), ``scheduled_late_ms_max`` (the
latest first delivery after its due time ``t_done + d``, in ms, over messages whose life
saw no fault; ``scheduled_late_ms_max_fault`` over the others), ``priority_batches`` /
``priority_pairs_checked``, ``group_messages`` / ``group_owner_changes`` /
``group_changes_excused`` / ``group_changes_reordered`` / ``group_redelivered_across``, ``selector_hits`` /
``selector_misses`` (receipted), ``selector_hits_delivered`` / ``selector_misses_drained``
/ ``selector_redelivered_across``.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from chaos.nemesis.history import (
    Delivery,
    Fault,
    History,
    MessageProps,
    ProbeRun,
    Send,
    Subscriber,
    Sync,
)


class _Checker(Protocol):
    """What these rules use of :class:`chaos.nemesis.checker._Checker`."""

    @property
    def h(self) -> History: ...
    @property
    def complete(self) -> bool: ...
    @property
    def stats(self) -> dict[str, int]: ...
    @property
    def by_dest(self) -> Mapping[str, Sequence[Subscriber]]: ...
    @property
    def app(self) -> Mapping[tuple[str, str], Sequence[Delivery]]: ...
    @property
    def wire(self) -> Mapping[tuple[str, str], Sequence[Delivery]]: ...
    @property
    def key_wire(self) -> Mapping[str, Sequence[Delivery]]: ...

    def violate(self, rule: str, t: float, summary: str, records: Iterable[tuple[str, Any]] = (),
                around: tuple[float, float] | None = None) -> None: ...

    def confirmed_acks(self) -> dict[tuple[str, str], tuple[float, Any]]: ...

__all__ = ["FEATURE_RULES", "OUTAGE_MIN_S", "SCHEDULED_SLACK_S", "TAKEOVER_S", "check_features", "outages"]

FEATURE_RULES = ("scheduled-early", "scheduled-late", "priority-order", "group-lost", "group-duplicate",
                 "group-split", "selector-lost", "selector-miss-delivered", "selector-duplicate")
EARLY_EPS_S = 0.002  # history times are rounded to 0.1 ms
SCHEDULED_SLACK_S = 5.0  # a loaded 2-core machine: how late "on time" may be
TAKEOVER_S = 10.0  # after a fault ends, how long the pair may take to serve again
OUTAGE_MIN_S = 1.0  # no node answering the client-port probes this long: the pair was not serving


def check_features(ck: _Checker) -> None:
    """Judge the feature rules on ``ck``'s history (see the module docstring)."""
    props = {p.key: p for p in ck.h.props}
    if not props:
        return
    _Features(ck, props).run()


def outages(probes: Sequence[ProbeRun], min_s: float = OUTAGE_MIN_S) -> list[tuple[float, float]]:
    """The stretches (start, end) of at least ``min_s`` in which no node answered a
    client-port probe: every node's runs of unanswered probes intersected."""
    by_node: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in probes:
        if not r.answered:
            by_node[r.node].append((r.first_t0, r.last_t1))
    if not by_node:
        return []
    nodes = {r.node for r in probes}
    if set(by_node) != nodes:
        return []  # a node that always answered
    common: list[tuple[float, float]] | None = None
    for spans in by_node.values():
        spans.sort()
        if common is None:
            common = spans
            continue
        out = []
        i = j = 0
        while i < len(common) and j < len(spans):
            lo, hi = max(common[i][0], spans[j][0]), min(common[i][1], spans[j][1])
            if lo < hi:
                out.append((lo, hi))
            if common[i][1] < spans[j][1]:
                i += 1
            else:
                j += 1
        common = out
    return [(a, b) for a, b in common or [] if b - a >= min_s]


class _Links:
    """The grouped queue's consumer links, for :meth:`_Features._splits`: each link's
    wire deliveries in the order its one reader read them (the broker's write order),
    the keys it had, each consumer's latest link generation, each link's syncs."""

    def __init__(self, wire: Sequence[Delivery], syncs: Iterable[Sync], group_of: Mapping[str, str],
                 sends: Mapping[str, Send]) -> None:
        self.group_of = group_of
        self.sends = sends
        self.wire: dict[tuple[str, int], list[Delivery]] = defaultdict(list)
        self.last_gen: dict[str, int] = {}
        for d in wire:
            self.wire[(d.sub, d.gen)].append(d)
            self.last_gen[d.sub] = max(self.last_gen.get(d.sub, d.gen), d.gen)
        self.keys = {link: {d.key for d in ds} for link, ds in self.wire.items()}
        self.syncs: dict[tuple[str, int], list[Sync]] = defaultdict(list)
        for s in syncs:
            if s.sub in self.last_gen:
                self.last_gen[s.sub] = max(self.last_gen[s.sub], s.gen_after)
                if s.ok and s.gen_before == s.gen_after:
                    self.syncs[(s.sub, s.gen_before)].append(s)

    def handed_back_first(self, d1: Delivery, d2: Delivery) -> bool:
        """Did the broker give d2's group G to d2's consumer Y (on link L_Y) before d1's
        consumer X (on L_X), though the client read X's copy first? Yes when

        * L_X got a message L_Y had had before, or as, its first message of G: a message
          leaves a consumer's link only when the link closes (the workload's consumers
          neither NACK nor unsubscribe; L_X went on, so the message came from L_Y);
        * Y did move to a later link (a message given back by a link that goes on is a
          broker bug, not a reordering); and
        * nothing shows the broker serving L_Y after L_X's first message of G came in: no
          message on L_Y *sent* after that, no sync *begun* after it and receipted on L_Y
          (one clock for the whole harness: these are causal, not the readers' order).

        Then L_Y closed after it got d2 and before L_X got G: G moved from Y to X."""
        g = self.group_of[d2.key]
        x_link, y_link = (d1.sub, d1.gen), (d2.sub, d2.gen)
        if self.last_gen.get(d2.sub, d2.gen) <= d2.gen:
            return False
        had = self.keys.get(y_link, set())
        for d in self.wire[x_link]:
            if d.key in had:
                break  # given back by L_Y: it had closed
            if self.group_of[d.key] == g:
                return False  # X had G before anything came back from L_Y
        else:
            return False
        first_g = next(d for d in self.wire[x_link] if self.group_of[d.key] == g)
        sent_after = [d for d in self.wire[y_link] if d.key in self.sends and self.sends[d.key].t > first_g.t]
        return not sent_after and not any(s.t > first_g.t for s in self.syncs.get(y_link, ()))


class _Features:
    def __init__(self, ck: _Checker, props: dict[str, MessageProps]) -> None:
        self.ck = ck
        self.props = props
        self.faults: list[Fault] = sorted(ck.h.faults, key=lambda f: f.t)
        self.fault_starts = [f.t for f in self.faults]
        self.health = {r.round: r.health_s for r in ck.h.rounds}
        self.outages = outages(ck.h.probes)
        self.sends: dict[str, Send] = {}
        for s in ck.h.sends:
            if s.key in props and s.kind == "rcpt":
                self.sends[s.key] = s  # the last record of a key is its outcome

    def run(self) -> None:
        self.check_scheduled()
        self.check_priority()
        self.check_groups()
        self.check_selectors()

    # -- helpers ------------------------------------------------------------------
    def faults_between(self, t0: float, t1: float) -> list[Fault]:
        """Faults active at some time in [t0, t1]."""
        hi = bisect.bisect_right(self.fault_starts, t1)
        return [f for f in self.faults[:hi] if f.t_end >= t0]

    def late_bound(self, s: Send, due: float, with_outages: bool = True) -> tuple[float, bool]:
        """The latest acceptable first delivery of a scheduled send, and whether a fault
        (or an outage) moved it."""
        bound = due + SCHEDULED_SLACK_S
        moved = False
        # (start, the bound it moves to), by start: a moved bound may reach the next one
        events = [(f.t, f.t_end + max(TAKEOVER_S, self.health.get(f.round, 0.0)) + SCHEDULED_SLACK_S)
                  for f in self.faults_between(s.t, float("inf"))]
        if with_outages:
            events += [(a, b + SCHEDULED_SLACK_S) for a, b in self.outages if b >= s.t]
        for start, to in sorted(events):
            if start > bound:
                break
            if to > bound:
                bound, moved = to, True
        return bound, moved

    # -- scheduled ----------------------------------------------------------------
    def check_scheduled(self) -> None:
        ck = self.ck
        sent = delivered = 0
        late_max = late_max_fault = 0.0
        late_outage = 0
        for key, p in self.props.items():
            s = self.sends.get(key)
            if p.delay_ms <= 0 or s is None:
                continue
            sent += 1
            delay = p.delay_ms / 1000
            early = [d for d in ck.key_wire.get(key, []) if d.t < s.t + delay - EARLY_EPS_S]
            if early:
                d = early[0]
                ck.violate("scheduled-early", d.t,
                           f"{key} (AMQ_SCHEDULED_DELAY {p.delay_ms} ms, SEND started at {s.t:.3f}) reached "
                           f"{d.sub} at {d.t:.3f}, {(s.t + delay - d.t) * 1000:.0f} ms before it was due",
                           [("props", p), ("send", s), *(("delivery", x) for x in early)], around=(s.t, d.t))
            if s.outcome != "ok":
                continue
            due = s.t_done + delay
            for sub in ck.by_dest.get(s.dest, ()):
                firsts = ck.app.get((sub.name, key))
                if not firsts:
                    continue  # the lost rule's business
                delivered += 1
                # when the broker handed it out: its first copy on that consumer's wire (the
                # application may take it from the client's buffer seconds later when the
                # harness process is starved: not the timetable's lateness)
                wire = ck.wire.get((sub.name, key))
                first = wire[0] if wire and wire[0].t < firsts[0].t else firsts[0]
                bound, moved = self.late_bound(s, due)
                late = first.t - due
                if moved and first.t <= bound and first.t > self.late_bound(s, due, with_outages=False)[0]:
                    late_outage += 1  # on time only thanks to an outage
                if moved:
                    late_max_fault = max(late_max_fault, late)
                else:
                    late_max = max(late_max, late)
                if first.t > bound:
                    ck.violate("scheduled-late", first.t,
                               f"{key} (AMQ_SCHEDULED_DELAY {p.delay_ms} ms, receipted at {s.t_done:.3f}, due by "
                               f"{due:.3f}) first reached {sub.name} at {first.t:.3f}: {late:.1f} s late, past "
                               f"the bound {bound:.3f}" + (" (moved by the faults and outages around it)" if moved else ""),
                               [("props", p), ("send", s), ("delivery", first)], around=(s.t, first.t))
        st = ck.stats
        st["scheduled_sent"] = sent
        st["scheduled_delivered"] = delivered
        st["scheduled_late_outage"] = late_outage
        st["scheduled_late_ms_max"] = round(late_max * 1000)
        st["scheduled_late_ms_max_fault"] = round(late_max_fault * 1000)

    # -- priority -----------------------------------------------------------------
    def check_priority(self) -> None:
        ck = self.ck
        batches: dict[tuple[str, int], list[str]] = defaultdict(list)
        for key, p in self.props.items():
            s = self.sends.get(key)
            if p.batch and s is not None and s.outcome == "ok":
                batches[(s.client, p.batch)].append(key)
        first: dict[str, tuple[int, Delivery]] = {}  # key -> (index, first wire delivery)
        for i, d in enumerate(ck.h.deliveries):
            if d.stage == "wire" and d.key in self.props and self.props[d.key].batch and d.key not in first:
                first[d.key] = (i, d)
        pairs = 0
        for (client, batch), keys in batches.items():
            sessions: dict[tuple[str, int], list[tuple[int, str]]] = defaultdict(list)
            for key in keys:
                if key in first:
                    i, d = first[key]
                    sessions[(d.sub, d.gen)].append((i, key))
            for (sub, gen), got in sessions.items():
                got.sort()
                order = [k for _, k in got]
                pairs += len(order) * (len(order) - 1) // 2
                bad = self._inversion(order)
                if bad is not None:
                    a, b = bad
                    pa, pb = self.props[a].priority, self.props[b].priority
                    da, db = first[a][1], first[b][1]
                    ck.violate("priority-order", db.t,
                               f"batch {batch} of {client} (receipted before {sub} subscribed): {b} (priority {pb}) "
                               f"reached {sub} at {db.t:.3f} after {a} (priority {pa}) at {da.t:.3f} on the same "
                               f"link (generation {gen})" + (" though it was sent first" if pa == pb else ""),
                               [("props", self.props[k]) for k in order] + [("delivery", da), ("delivery", db)],
                               around=(da.t, db.t))
        ck.stats["priority_batches"] = len(batches)
        ck.stats["priority_pairs_checked"] = pairs

    def _inversion(self, order: list[str]) -> tuple[str, str] | None:
        """The first pair (a before b) that breaks priority-then-send order, or None."""
        def rank(k: str) -> tuple[int, float]:
            return (-self.props[k].priority, self.sends[k].t)

        for j in range(1, len(order)):
            for i in range(j):
                if rank(order[j]) < rank(order[i]):
                    return order[i], order[j]
        return None

    # -- groups -------------------------------------------------------------------
    def check_groups(self) -> None:
        ck = self.ck
        group_of = {k: p.group for k, p in self.props.items() if p.group}
        if not group_of:
            return
        app: dict[str, list[Delivery]] = defaultdict(list)
        wire: list[Delivery] = []
        span: dict[tuple[str, int], list[float]] = {}
        members: set[str] = set()
        for d in ck.h.deliveries:
            if d.key not in group_of:
                continue
            members.add(d.sub)
            if d.stage == "app":
                app[d.key].append(d)
            else:
                wire.append(d)
                sp = span.setdefault((d.sub, d.gen), [d.t, d.t])
                sp[1] = d.t
        n = 0
        for key in group_of:
            s = self.sends.get(key)
            if s is None or s.outcome != "ok":
                continue
            n += 1
            if ck.complete and not app.get(key):
                ck.violate("group-lost", s.t, f"{key} (group {group_of[key]}) to {s.dest}: receipted at "
                           f"{s.t_done:.3f} but reached none of its consumers ({', '.join(sorted(members))}; "
                           f"{len(ck.key_wire.get(key, []))} copies on the wire)",
                           [("send", s), *(("delivery", d) for d in ck.key_wire.get(key, []))], around=(s.t, s.t_done))
        ck.stats["group_messages"] = n
        ck.stats["group_redelivered_across"] = self._cross_duplicates(app, "group-duplicate")
        self._splits(wire, span, group_of)

    def _cross_duplicates(self, app: Mapping[str, Sequence[Delivery]], rule: str) -> int:
        """``rule`` (``group-duplicate``, ``selector-duplicate``) on the application
        deliveries of each key; how many keys reached a second consumer legitimately."""
        ck = self.ck
        across = [(key, ds) for key, ds in app.items() if len({d.sub for d in ds}) > 1]
        confirmed = ck.confirmed_acks() if across else {}
        redelivered = 0
        for key, ds in across:
            ds = sorted(ds, key=lambda d: d.t)
            for later in ds[1:]:
                # when the copy the application got came in on the wire (a copy received
                # before its link died may reach the application later, from the buffer)
                arrived = max((w.t for w in ck.wire.get((later.sub, key), []) if w.t <= later.t), default=later.t)
                earlier = [d for d in ds if d.sub != later.sub and d.t < later.t]
                proof = [(confirmed[(d.sub, key)][0], d) for d in earlier if (d.sub, key) in confirmed]
                proof = [(at, d) for at, d in proof if at < arrived]
                if proof:
                    at, d = min(proof, key=lambda x: x[0])
                    ck.violate(rule, later.t,
                               f"{key} reached {later.sub} at {later.t:.3f} (on its wire at {arrived:.3f}) after "
                               f"{d.sub} got it at {d.t:.3f} and its ACK was known durable at {at:.3f}",
                               [("delivery", x) for x in ds], around=(d.t, later.t))
                    break
            else:
                redelivered += 1
        return redelivered

    def _splits(self, wire: list[Delivery], span: dict[tuple[str, int], list[float]],
                group_of: dict[str, str]) -> None:
        ck = self.ck
        links = _Links(wire, ck.h.syncs, group_of, self.sends)
        changes = excused = reordered = 0
        owner: dict[str, Delivery] = {}  # group -> its latest delivery (to its current owner)
        before: dict[str, Delivery] = {}  # group -> the previous owner's last delivery
        for d2 in wire:  # in arrival order
            g = group_of[d2.key]
            d1 = owner.get(g)
            owner[g] = d2
            if d1 is None or d1.sub == d2.sub or d1.t > d2.t:
                continue
            changes += 1
            d0, before[g] = before.get(g), d1
            verdict = self._move(d1, d2, span, links)
            if verdict == "reordered":
                # the broker gave g to d2's consumer before d1's: what it moved from was
                # the owner before d1's
                reordered += 1
                if d0 is None or d0.sub == d2.sub:
                    continue
                d1, verdict = d0, self._move(d0, d2, span, None)
            if verdict == "excused":
                excused += 1
            elif verdict == "split":
                x_until = span[(d1.sub, d1.gen)][1]
                y_since = span[(d2.sub, d2.gen)][0]
                ck.violate("group-split", d2.t,
                           f"group {g}: {d2.key} reached {d2.sub} at {d2.t:.3f} while {d1.sub}, which got {d1.key} "
                           f"of the group at {d1.t:.3f}, stayed on the same link (generation {d1.gen}) until "
                           f"{x_until:.3f} and {d2.sub}'s link (generation {d2.gen}) was up since {y_since:.3f}",
                           [("delivery", d1), ("delivery", d2)], around=(d1.t, x_until))
        ck.stats["group_owner_changes"] = changes
        ck.stats["group_changes_excused"] = excused
        ck.stats["group_changes_reordered"] = reordered

    def _move(self, d1: Delivery, d2: Delivery, span: dict[tuple[str, int], list[float]],
              links: _Links | None) -> str:
        """The group's move from d1's consumer X to d2's consumer Y: ``ok`` (a consumer
        changed), ``excused`` (a fault), ``reordered`` (the broker gave it to Y first,
        see :meth:`_Links.handed_back_first`; only with ``links``) or ``split``."""
        x_until = span[(d1.sub, d1.gen)][1]
        y_since = span[(d2.sub, d2.gen)][0]
        if x_until <= d2.t or y_since >= d1.t:
            return "ok"  # a consumer changed: x's link was gone, or y's is new
        if links is not None and links.handed_back_first(d1, d2):
            return "reordered"
        if self.faults_between(d1.t, x_until):
            return "excused"
        return "split"

    # -- selectors ----------------------------------------------------------------
    def check_selectors(self) -> None:
        ck = self.ck
        k_of = {key: p.k for key, p in self.props.items() if p.k}
        if not k_of:
            return
        selective = {x.name: x.selector for subs in ck.by_dest.values() for x in subs if x.selector}
        for d in ck.h.deliveries:
            if d.stage == "wire" and d.sub in selective and k_of.get(d.key) == "miss":
                ck.violate("selector-miss-delivered", d.t,
                           f"{d.key} (k = 'miss') reached {d.sub} (selector {selective[d.sub]!r}) on its wire "
                           f"at {d.t:.3f} (message id {d.msg_id})", [("props", self.props[d.key]), ("delivery", d)])
        counts = dict.fromkeys(("hits", "misses", "hits_delivered", "misses_drained"), 0)
        for key, k in k_of.items():
            s = self.sends.get(key)
            if s is None or s.outcome != "ok":
                continue
            hit = k == "hit"
            counts["hits" if hit else "misses"] += 1
            # a hit is owed to every selective subscriber, a miss to one without a selector
            subs = [x for x in ck.by_dest.get(s.dest, ()) if bool(x.selector) == hit]
            if not subs:
                continue
            missing = [x for x in subs if (x.name, key) not in ck.app]
            if not missing if hit else len(missing) < len(subs):
                counts["hits_delivered" if hit else "misses_drained"] += 1
                continue
            if not ck.complete:
                continue
            copies = ck.key_wire.get(key, [])
            who = ", ".join(x.name for x in missing)
            ck.violate("selector-lost", s.t,
                       f"{key} (k = '{k}') to {s.dest}: receipted at {s.t_done:.3f} but never reached "
                       + (f"the selective subscriber {who}" if hit else f"the subscriber without a selector {who}")
                       + f" ({len(copies)} copies on any wire: {', '.join(sorted({d.sub for d in copies})) or 'none'})",
                       [("props", self.props[key]), ("send", s), *(("delivery", d) for d in copies)],
                       around=(s.t, s.t_done))
        app: dict[str, list[Delivery]] = defaultdict(list)
        for (_sub, key), ds in ck.app.items():
            if key in k_of:
                app[key].extend(ds)
        st = ck.stats
        for name, n in counts.items():
            st[f"selector_{name}"] = n
        st["selector_redelivered_across"] = self._cross_duplicates(app, "selector-duplicate")
