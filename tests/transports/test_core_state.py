"""The failover core's state machine (transports/core_state.py): the transition table
agrees with the diagram in transports/core.py's docstring, the state changes in one
place, an event the table does not allow raises, and the reconnect that used to be a
separate ``reconnecting`` flag is the states ``reconnecting``/``replaying``/``resuming``."""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

import pytest

from amqtransport.errors import ConnectionClosed, LocalProtocolError, ReconnectExhausted
from amqtransport.options import FailoverOptions
from amqtransport.stomp import Frame
from amqtransport.transports import core as core_module
from amqtransport.transports.base import Receipt
from amqtransport.transports.core import FailoverCore, Reconnect
from amqtransport.transports.core_state import TRANSITIONS, IllegalTransition, State, next_state

ROOT = Path(__file__).resolve().parent.parent.parent
ARROW = re.compile(r"^\s+([a-z|_]+) --([a-z_]+)--> ([a-z_]+)\s*$")


class FakeLink:
    def __init__(self, name: str) -> None:
        self.name = name


def make_core(**options: object) -> FailoverCore[FakeLink]:
    ids = itertools.count(1)
    return FailoverCore(FailoverOptions.model_validate(options), lambda p: f"{p}-{next(ids)}")


def up(core: FailoverCore[FakeLink], link: FakeLink) -> None:
    install = core.link_up(link)
    assert install is not None
    assert core.replay_written(install, ok=True, alive=True) is not None


def diagram_transitions() -> dict[tuple[str, str], str]:
    doc = core_module.__doc__ or ""
    table: dict[tuple[str, str], str] = {}
    for line in doc.splitlines():
        m = ARROW.match(line)
        if m:
            for source in m.group(1).split("|"):
                assert (source, m.group(2)) not in table, f"the diagram lists {source} --{m.group(2)}--> twice"
                table[(source, m.group(2))] = m.group(3)
    return table


def test_the_table_and_the_docstring_diagram_agree() -> None:
    drawn = diagram_transitions()
    assert len(drawn) > 10  # the diagram was found
    assert drawn == {(state.value, event): new.value for (state, event), new in TRANSITIONS.items()}


def test_every_state_is_reachable_and_closed_is_final() -> None:
    reached, frontier = {State.NEW}, [State.NEW]
    while frontier:
        state = frontier.pop()
        for (source, _), target in TRANSITIONS.items():
            if source is state and target not in reached:
                reached.add(target)
                frontier.append(target)
    assert reached == set(State)
    assert [key for key in TRANSITIONS if key[0] is State.CLOSED] == []
    assert [event for (source, event) in TRANSITIONS if source is State.FAILED] == ["close"]


def test_the_state_changes_only_in_one_place() -> None:
    """``self.state = ...`` appears in ``__init__`` (the start) and ``_to`` only."""
    tree = ast.parse((ROOT / "amqtransport/transports/core.py").read_text(encoding="utf-8"))
    writers = set()
    for func in ast.walk(tree):
        if isinstance(func, ast.FunctionDef):
            for node in ast.walk(func):
                targets = node.targets if isinstance(node, ast.Assign) else (
                    [node.target] if isinstance(node, ast.AnnAssign | ast.AugAssign) else [])
                for target in targets:
                    for t in ast.walk(target):
                        if isinstance(t, ast.Attribute) and t.attr == "state":
                            writers.add(func.name)
    assert writers == {"__init__", "_to"}


def test_an_event_the_table_does_not_allow_raises() -> None:
    with pytest.raises(IllegalTransition, match="'resumed' is not allowed in state 'new'"):
        next_state(State.NEW, "resumed")
    assert issubclass(IllegalTransition, LocalProtocolError)
    core = make_core()
    core.start()
    with pytest.raises(IllegalTransition, match="'start'"):
        core.start()  # twice
    up(core, FakeLink("a"))
    assert core.state is State.CONNECTED
    with pytest.raises(IllegalTransition, match="'resumed' is not allowed in state 'connected'"):
        core.resumed()  # no reconnect is running
    with pytest.raises(IllegalTransition, match="'replayed'"):
        core.stepwise_connected()  # nothing was replaying
    assert core.state is State.CONNECTED  # a refused event changes nothing
    core.fail(ReconnectExhausted("gave up", attempts=1, last_error=None))
    with pytest.raises(IllegalTransition, match="'gave_up' is not allowed in state 'failed'"):
        core.startup_failed(ReconnectExhausted("again", attempts=1, last_error=None))


def test_the_running_reconnect_is_a_state_not_a_flag() -> None:
    """A loss while connected asks for a reconnect; a loss while that reconnect is still
    running (replaying stepwise, or telling the listeners) asks for none: the running
    one loops. The link is usable while ``resuming``."""
    core = make_core()
    core.start()
    assert core.state is State.CONNECTING
    a, b, c, d = (FakeLink(n) for n in "abcd")
    up(core, a)
    assert [type(x) for x in core.link_lost(a, ConnectionClosed("a"))] == [Reconnect]
    assert core.state is State.RECONNECTING and core.current() is None
    up(core, b)
    assert core.state is State.RESUMING and core.current() == (b, 2)
    assert core.link_lost(b, ConnectionClosed("b")) == []  # the running reconnect loops
    assert core.state is State.RECONNECTING and core.resumed() is False
    core.request(Receipt("r-1", Frame.make("SEND", {"destination": "/queue/q", "receipt": "r-1"})))
    core.on_error(Frame.make("ERROR", {"message": "no"}), link_error_frame=None, has_link=True)
    up(core, c)
    assert core.state is State.REPLAYING
    assert core.link_lost(c, ConnectionClosed("c")) == []
    up(core, d)
    assert core.state is State.REPLAYING  # the refusal is still unexplained
    core.stepwise_connected()
    assert core.state is State.RESUMING
    assert core.resumed() is True and core.state is State.CONNECTED
    assert [type(x) for x in core.link_lost(d, ConnectionClosed("d"))] == [Reconnect]
    assert core.reconnects == 4


def test_a_retired_links_loss_and_a_loss_after_the_end_change_nothing() -> None:
    core = make_core()
    core.start()
    a, b = FakeLink("a"), FakeLink("b")
    up(core, a)
    assert core.link_lost(b, ConnectionClosed("never current")) == []
    assert core.state is State.CONNECTED
    core.close()
    assert core.link_lost(a, ConnectionClosed("after close")) == [] and core.state is State.CLOSED
    assert core.close() == [] and core.fail(ReconnectExhausted("late", attempts=0, last_error=None)) == []
    assert core.resumed() is True and core.state is State.CLOSED
