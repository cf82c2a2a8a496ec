"""The ``group-split`` rule (chaos/nemesis/feature_rules.py) on the excerpt of the one
run that reported it on the final code (issue 22): the shared-store pair, power loss
of master a at 4.82, a kernel partition between master b and the clients 6.09-7.90.
After the partition, b dropped its silent clients in two batches 0.5 s apart; the
second batch held both c-group2 (the owner of group g2, five of its messages unacked)
and c-group3. b gave g2 to c-group3 when it dropped c-group2, then to c-group1 (on its
new link 3, from the first batch) when it dropped c-group3: c-group1's link got
c-group3's own g3 messages back *before* its first message of g2. The client read
c-group3's copies 0.3 ms after c-group1's (two sockets, two reader threads), which the
rule took for a move from c-group1 to c-group3 while both stayed. No broker: the
checker is a pure function of the history.
"""

from __future__ import annotations

import pytest

from chaos.nemesis.checker import check
from chaos.nemesis.history import Delivery, Fault, History, MessageProps, Send, Subscriber, Sync

pytestmark = pytest.mark.chaos

# (key number, group g<n>, SEND started, receipted) of p-group's messages 32-62
SENT = (
    (32, 1, 4.8622, 4.9653), (33, 2, 4.9627, 5.0623), (34, 3, 5.0622, 5.1621), (35, 0, 5.1621, 6.0833),
    (36, 1, 5.2621, 6.0833), (37, 2, 5.3621, 6.0833), (38, 3, 5.4621, 6.0833), (39, 0, 5.5621, 6.0833),
    (40, 1, 5.6621, 6.0833), (41, 2, 5.7621, 6.0833), (42, 3, 5.8621, 6.0833), (43, 0, 5.9621, 8.1283),
    (44, 1, 6.0833, 8.1283), (45, 2, 6.1621, 8.1283), (46, 3, 6.2621, 8.1283), (47, 0, 6.3621, 8.1283),
    (48, 1, 6.4621, 8.1283), (49, 2, 6.5621, 8.1283), (50, 3, 6.6621, 8.1283), (51, 0, 6.7621, 8.2286),
    (52, 1, 8.1283, 8.2286), (53, 2, 8.2284, 8.3285), (54, 3, 8.3284, 8.4285), (55, 0, 8.4284, 8.5286),
    (56, 1, 8.5284, 8.6284), (57, 2, 8.6284, 9.2285), (58, 3, 8.7284, 9.2285), (59, 0, 8.8284, 9.2285),
    (60, 1, 8.9284, 9.2285), (61, 2, 9.0284, 9.2285), (62, 3, 9.1284, 9.2285),
)

# every MESSAGE of the grouped queue on the three consumers' wires 4.9-9.2 s, in the
# recorded order: time, c-group<n>, key number, message id's sequence, link generation
WIRE = """
4.9552 2 32 6 2    4.9702 2 33 14 2   5.0625 3 34 49 2   6.0774 2 35 107 2  6.0775 2 36 108 2
6.0775 2 37 109 2  6.0775 2 39 111 2  6.0775 2 40 112 2  6.0775 2 41 113 2  6.0792 3 38 110 2
6.0793 3 42 114 2  8.0621 2 43 176 2  8.0621 2 44 177 2  8.1274 2 45 203 2  8.1275 2 47 205 2
8.1275 2 48 206 2  8.1275 2 49 207 2  8.1278 3 46 204 2  8.1278 3 50 208 2  8.1714 2 51 230 2
8.1714 2 52 231 2  8.2289 2 53 302 2  8.3289 3 54 308 2  8.4289 2 55 319 2  8.5293 2 56 331 2
8.5988 1 36 108 3  8.5988 1 39 111 3  8.5988 1 40 112 3  8.5988 1 43 176 3  8.5989 1 44 177 3
8.5989 1 47 205 3  8.5989 1 48 206 3  8.5989 1 51 230 3  8.5989 1 52 231 3  8.5989 1 55 319 3
8.599 1 56 331 3   8.599 1 42 114 3   8.599 1 46 204 3   8.599 1 50 208 3   8.599 1 54 308 3
8.599 1 37 109 3   8.5991 1 41 113 3  8.5991 1 45 203 3  8.5991 1 49 207 3  8.5991 1 53 302 3
8.5994 3 37 109 2  8.5994 3 41 113 2  8.5994 3 45 203 2  8.5994 3 49 207 2  8.5994 3 53 302 2
9.1236 1 57 348 3  9.1236 1 58 349 3  9.1237 1 59 350 3  9.1237 1 60 351 3  9.1237 1 61 352 3
9.1637 1 62 391 3
"""

# the consumers' syncs 4.9-9.2 s: (started, who, link before, link after, receipted)
SYNCS = (
    (4.9703, 2, 2, 2, 5.0159), (5.0626, 3, 2, 2, 5.1035), (5.0638, 1, 2, 2, 5.1074),
    (6.0793, 2, 2, 2, 8.0622), (6.0818, 3, 2, 2, 8.0627), (8.6002, 1, 3, 3, 8.6513),
    (8.9025, 1, 3, 3, 9.164), (8.0622, 2, 2, 3, 9.1642), (8.0628, 3, 2, 3, 9.1644),
    (9.1643, 2, 3, 3, 9.6835), (9.1644, 3, 3, 3, 9.6868),
)


def recorded(wire: str = WIRE, syncs: tuple[tuple[float, int, int, int, float], ...] = SYNCS) -> History:
    h = History({"mode": "shared-store"})
    h.extend([Subscriber(f"c-group{n}", "/queue/nemesis.group", "client-individual") for n in (1, 2, 3)])
    h.extend([
        Fault(4.8193, 4.8249, 1, "power-loss", "a", "power loss of the master"),
        Fault(6.0896, 7.8957, 1, "partition-clients", "b", "kernel drop: b->clients, clients->b (master b)"),
        Fault(6.6787, 6.9415, 1, "restart-dead", "a", "restarted"),
    ])
    for n, g, t, t_done in SENT:
        h.add(MessageProps(t, f"p-group:{n}", group=f"p-group-g{g}"))
        h.add(Send(t, "p-group", "/queue/nemesis.group", f"p-group:{n}", "rcpt", "ok", t_done))
    fields = wire.split()
    for i in range(0, len(fields), 5):
        t, c, n, seq, gen = fields[i:i + 5]
        h.add(Delivery(float(t), f"c-group{c}", f"p-group:{n}", f"ID:b-36bef7b0-{seq}", int(gen), "wire"))
    h.extend([Sync(t, f"c-group{c}", g0, g1, t_done, True) for t, c, g0, g1, t_done in syncs])
    h.t_end = 14.2
    return h


def splits(h: History) -> list[str]:
    return [v.summary for v in check(h, complete=False).violations if v.rule == "group-split"]


def test_the_recorded_handover_through_a_dropped_consumer_is_no_split() -> None:
    """c-group1's link 3 got c-group3's g3 messages (42, 46, 50, 54: only c-group3's
    closing could give them back) before its first message of g2: the broker gave g2
    to c-group1 after it had closed c-group3's link 2, whatever the reader threads'
    clocks say; and c-group3 did move to a new link."""
    result = check(recorded(), complete=False)
    assert not splits(recorded()), [v.summary for v in result.violations]
    assert result.stats["group_changes_reordered"] == 1


def test_the_same_copies_while_the_second_consumer_stays_on_its_link_are_a_split() -> None:
    """The same frames, but c-group3 never changes link: messages came off a link the
    broker still served (it gave c-group3's messages away and kept writing to it)."""
    syncs = tuple((t, c, g0, 2 if c == 3 else g1, t_done) for t, c, g0, g1, t_done in SYNCS
                  if not (c == 3 and g0 == 3))
    got = splits(recorded(syncs=syncs))
    assert len(got) == 1 and "p-group:37 reached c-group3 at 8.599" in got[0]


def test_a_later_message_on_the_second_consumers_old_link_is_a_split() -> None:
    """c-group3's link 2 gets a message SENT at 8.60, after c-group1 had g2 (8.599),
    before it ends: the broker still served that link after it gave g2 to c-group1, so
    what came back from it did not come from its closing."""
    h = recorded(wire=WIRE.replace("9.1236 1 57 348 3", "8.65 3 98 400 2  9.1236 1 57 348 3"))
    h.add(MessageProps(8.6, "p-group:98", group="p-group-g3"))
    h.add(Send(8.6, "p-group", "/queue/nemesis.group", "p-group:98", "rcpt", "ok", 8.62))
    got = splits(h)
    assert any("p-group:37 reached c-group3 at 8.599" in s for s in got), got


def test_a_sync_started_after_the_handover_and_receipted_on_the_old_link_is_a_split() -> None:
    syncs = (*SYNCS, (8.7, 3, 2, 2, 8.9))  # c-group3's link 2 answered a SEND begun after 8.599
    assert len(splits(recorded(syncs=syncs))) == 1


def test_the_first_consumer_holding_the_group_before_anything_came_back_is_a_split() -> None:
    """c-group1's link 3 gets a fresh message of g2 before any of c-group3's came back to
    it: nothing says c-group3's copies of g2 came first, so c-group1 held g2 while
    c-group3 got it."""
    h = recorded(wire=WIRE.replace("8.5988 1 36 108 3", "8.5987 1 99 340 3  8.5988 1 36 108 3"))
    h.add(MessageProps(8.55, "p-group:99", group="p-group-g2"))
    h.add(Send(8.55, "p-group", "/queue/nemesis.group", "p-group:99", "rcpt", "ok", 8.65))
    got = splits(h)
    assert len(got) == 1 and "p-group:37 reached c-group3 at 8.599" in got[0]
