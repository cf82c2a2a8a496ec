"""PageList (store/pages.py) taken by priority: against a model (a stably sorted list),
through any mix of appends, removals in the middle (acks), takes from the front and by
priority, and lists restored from a checkpoint's arrays with priorities unknown."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqtransport.broker.dispatch.message import Message
from amqtransport.broker.store import MessageStore
from amqtransport.broker.store.pages import UNKNOWN, PageList

ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 9), st.integers(1, 40)),
        st.tuples(st.just("top"), st.integers(1, 60), st.just(0)),
        st.tuples(st.just("front"), st.integers(1, 30), st.just(0)),
        st.tuples(st.just("remove"), st.integers(0, 10_000), st.just(0)),
        st.tuples(st.just("restore"), st.just(0), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_take_top_is_priority_order_fifo_within_a_priority(script: list[tuple[str, int, int]]) -> None:
    pl = PageList()
    model: list[tuple[int, int]] = []  # (seq, priority) in list order
    prio: dict[int, int] = {}
    seq = 0
    for op, a, b in script:
        if op == "add":
            for _ in range(b):
                seq += 1
                pl.append(seq, seq, float(seq), a)
                model.append((seq, a))
                prio[seq] = a
        elif op == "top":
            got = [p for p, _h, _t in pl.take_top(a)]
            want = [s for s, _p in sorted(model, key=lambda e: -e[1])[:a]]
            assert got == want
            model = [e for e in model if e[0] not in set(want)]
        elif op == "front":
            got = [p for p, _h, _t in pl.popleft(a)]
            assert got == [s for s, _p in model[:a]]
            model = model[a:]
        elif op == "remove" and model:
            s, _p = model.pop(a % len(model))
            pl.remove_at(pl.find(s))
        elif op == "restore":
            pos, ids, ts = pl.arrays()
            pl = PageList.from_arrays(pos, ids, ts, ordered=True)
            assert pl.unknown == len(model)
            for i in pl.unknown_slots():
                pl.set_priority(i, prio[pl.pos[i]])
        assert len(pl) == len(model)
        assert pl.top == max((p for _s, p in model), default=-1)


def test_take_top_refuses_while_priorities_are_unknown() -> None:
    pl = PageList()
    pl.append(1, 1, 1.0, UNKNOWN)
    assert pl.top == 9
    with pytest.raises(ValueError, match="not known"):
        pl.take_top(1)


def test_holes_left_by_taking_from_the_middle_are_reclaimed() -> None:
    pl = PageList()
    pl.append(1, 1, 0.0, 0)  # an old low-priority message stays at the front
    n = 0
    for _ in range(30):
        for _ in range(1000):
            n += 1
            pl.append(n + 1, n + 1, float(n), 9)
        assert len(pl.take_top(1000)) == 1000
    assert len(pl) == 1
    assert len(pl.pos) < 10_000  # not 30,001 slots
    assert [p for p, _h, _t in pl.take_top(5)] == [1]


def test_a_store_reopened_from_its_checkpoint_learns_the_priorities_back(tmp_path: Path) -> None:
    """A checkpoint holds no priorities: the reopened store's list does not know them
    until the queue pages in by priority, which reads them back from the journal."""
    store = MessageStore(tmp_path)
    store.open()
    prios = [(i * 7) % 10 for i in range(50)]
    for i, p in enumerate(prios):
        m = Message(id=f"ID:m{i}", destination="/queue/q", headers=(("priority", str(p)),), body=b"x",
                    timestamp=float(i), persistent=True)
        store.add(m)
        assert store.page_out(m)
    store.flush()
    store.close()
    store = MessageStore(tmp_path)
    store.open()
    try:
        assert store.checkpoints.last_recovery.startswith("recovered from the checkpoint")
        assert store.paged["/queue/q"].unknown == 50 and store.paged_top("/queue/q") == 9
        got = [m.id for m in store.take("/queue/q", 50, by_priority=True)]
        want = [f"ID:m{i}" for i in sorted(range(50), key=lambda i: -prios[i])]
        assert got == want
    finally:
        store.close()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 9), max_size=30), st.lists(st.integers(0, 9), max_size=30), st.integers(1, 80))
def test_a_shared_tails_entries_keep_their_priorities(own: list[int], shared: list[int], n: int) -> None:
    """Entries a list reads from a shared tail (store/fanout.py) are taken by priority
    like its own: the tail carries each entry's priority, top_priority counts them before
    they are copied, and take_top copies them first."""
    from amqtransport.broker.store.pages import SharedTail

    pl, tail = PageList(), SharedTail()
    for i, p in enumerate(own):
        pl.append(i + 1, i + 1, float(i + 1), p)
    pl.attach(tail, b"q")
    for j, p in enumerate(shared):
        tail.add(1000 + j, f"ID:{j}:".encode(), float(1000 + j), p)
    assert len(pl) == len(own) + len(shared)
    assert pl.top_priority() == max(own + shared, default=-1)
    model = [(i + 1, p) for i, p in enumerate(own)] + [(1000 + j, p) for j, p in enumerate(shared)]
    want = [s for s, _p in sorted(model, key=lambda e: -e[1])[:n]]
    assert [pos for pos, _h, _t in pl.take_top(n)] == want
