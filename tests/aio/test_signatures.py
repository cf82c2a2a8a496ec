"""The sync and the asyncio client take the same arguments the same way: every public
method of each twin (``Connection``/``AsyncConnection``, ``Producer``/``AsyncProducer``,
...) and ``connect`` have the same parameters, each positional or keyword-only alike,
with the same defaults. ``persistent``, ``ack`` and the credentials are keyword-only
in both (a positional ``True`` or ``"client"`` reads as nothing at the call site)."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest

import amqtransport.aio as aio
import amqtransport.client as sync

PAIRS = [
    (sync.Connection, aio.AsyncConnection),
    (sync.Producer, aio.AsyncProducer),
    (sync.Subscription, aio.AsyncSubscription),
    (sync.Transaction, aio.AsyncTransaction),
    (sync.Message, aio.AsyncMessage),
]
#: the sync connect's extra keyword-only injection points for tests (fake backend, clock)
SYNC_ONLY_CONNECT = {"backend", "sleep", "clock", "rng"}


def shape(fn: Callable[..., object], skip: set[str] = set()) -> list[tuple[str, str, object]]:  # noqa: B006
    return [(p.name, p.kind.name, p.default) for p in inspect.signature(fn).parameters.values()
            if p.name not in skip]


def public_methods(cls: type) -> dict[str, Callable[..., object]]:
    return {name: fn for name, fn in vars(cls).items() if not name.startswith("_") and inspect.isfunction(fn)}


@pytest.mark.parametrize(("sync_cls", "async_cls"), PAIRS, ids=lambda c: c.__name__)
def test_every_method_of_the_twins_takes_the_same_arguments(sync_cls: type, async_cls: type) -> None:
    mine, theirs = public_methods(sync_cls), public_methods(async_cls)
    assert sorted(mine) == sorted(theirs)
    differ = {name: (shape(mine[name]), shape(theirs[name])) for name in mine
              if shape(mine[name]) != shape(theirs[name])}
    assert differ == {}


def test_connect_takes_the_same_arguments_in_both_clients() -> None:
    assert shape(sync.connect, SYNC_ONLY_CONNECT) == shape(aio.connect)
    kinds = {p.name: p.kind for p in inspect.signature(sync.connect).parameters.values()}
    assert [name for name, kind in kinds.items() if kind is not inspect.Parameter.KEYWORD_ONLY] == ["uri"]


def test_persistent_and_ack_are_keyword_only() -> None:
    for fn in (sync.Connection.send, aio.AsyncConnection.send, sync.Producer.send, aio.AsyncProducer.send,
               sync.Transaction.send, aio.AsyncTransaction.send):
        assert inspect.signature(fn).parameters["persistent"].kind is inspect.Parameter.KEYWORD_ONLY, fn
    for fn in (sync.Connection.subscribe, aio.AsyncConnection.subscribe):
        assert inspect.signature(fn).parameters["ack"].kind is inspect.Parameter.KEYWORD_ONLY, fn
