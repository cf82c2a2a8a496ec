"""The compiled selector's tree: each node a closure over a :class:`~.jms.MessageView`.

:mod:`.parser` reads the grammar and builds the tree from these constructors. A
:class:`Node` carries its three-valued evaluation (``ev``: TRUE, FALSE, null or an
:class:`~.values.EvalError`), its TRUE-or-not test with Java's short-circuits (``m``),
what ActiveMQ's parse-time checks look at (its ``kind``, a literal's value) and the
``(header, value)`` pairs a message it is TRUE for must hold (``req``, the byte test of
broker/dispatch/scan.py). ``prop = 'text'``, the commonest selector, compares a string
property without :func:`~.values.compare`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Final

from .jms import JMS_NAMES, MessageView, header_sources
from .values import Value, arith, compare

__all__ = [
    "BOOL", "CONST", "OTHER", "PROP", "Eval", "Node", "Required", "arith_node", "const", "equals", "in_", "like",
    "logic", "not_", "ordering", "prop",
]

Eval = Callable[["MessageView"], Value]

# node kinds: what ActiveMQ's parse-time checks look at
CONST, PROP, BOOL, OTHER = "const", "prop", "bool", "other"


def _is_true(ev: Eval) -> Callable[[MessageView], bool]:
    def m(v: MessageView) -> bool:
        return ev(v) is True

    return m


#: ``(header, value)`` pairs, one of which a message's headers hold whenever a node is
#: TRUE for it (see Selector.required); None: no such pairs known
Required = tuple[tuple[str, str], ...] | None


class Node:
    __slots__ = ("kind", "value", "ev", "m", "pos", "req")

    def __init__(self, kind: str, ev: Eval, pos: int, *, value: Value = None, m: Callable[[MessageView], bool] | None = None,
                 req: Required = None) -> None:
        self.kind = kind  # CONST (a literal; TRUE/FALSE/NULL are BOOL too, see is_bool), PROP, BOOL, OTHER
        self.value = value  # a CONST's value; a PROP's name
        self.req = req
        self.ev = ev
        self.pos = pos
        # ``matches``: TRUE-or-not, with Java's short-circuits (AND/OR stop at the first
        # child that is not TRUE/that is TRUE; NOT evaluates its operand three-valued)
        self.m = m or _is_true(ev)

    @property
    def is_bool(self) -> bool:
        return self.kind == BOOL or (self.kind == CONST and (self.value is None or type(self.value) is bool))



def const(value: Value, pos: int) -> Node:
    return Node(CONST, lambda _v: value, pos, value=value)


def prop(name: str, pos: int) -> Node:
    if name in JMS_NAMES:
        return Node(PROP, lambda v: v.jms.get(name), pos, value=name)
    return Node(PROP, lambda v: v.props.get(name), pos, value=name)


def _required_of(parts: Sequence[Node], *, is_and: bool) -> Required:
    """AND: any part's pairs will do (each part must be TRUE), the fewest; OR: every part's."""
    reqs = [p.req for p in parts]
    if is_and:
        known = [r for r in reqs if r is not None]
        return min(known, key=len) if known else None
    if any(r is None for r in reqs):
        return None
    return tuple(pair for r in reqs if r is not None for pair in r)


def _pairs(left: Node, values: Sequence[str]) -> Required:
    """``left`` is a property that equals one of ``values`` (a string each)."""
    sources = header_sources(left.value) if left.kind == PROP and isinstance(left.value, str) else None
    if sources is None:
        return None
    return tuple((h, text) for text in values for h in sources)


def logic(parts: Sequence[Node], *, is_and: bool) -> Node:
    evs = tuple(p.ev for p in parts)
    ms = tuple(p.m for p in parts)
    if is_and:

        def ev(v: MessageView) -> Value:
            nulls = False
            for e in evs:
                r = e(v)
                if r is False:
                    return False
                if r is None:
                    nulls = True
            return None if nulls else True

        def m(v: MessageView) -> bool:
            return all(x(v) for x in ms)

    else:

        def ev(v: MessageView) -> Value:
            nulls = False
            for e in evs:
                r = e(v)
                if r is True:
                    return True
                if r is None:
                    nulls = True
            return None if nulls else False

        def m(v: MessageView) -> bool:
            return any(x(v) for x in ms)

    return Node(BOOL, ev, parts[0].pos, m=m, req=_required_of(parts, is_and=is_and))


def _equals_string(left: Node, text: str, convert: bool, pos: int) -> Node:
    """``prop = 'text'``, the commonest selector: a string property compared without
    :func:`compare` (any other type of value goes through it, as in :func:`equals`)."""
    le = left.ev

    def ev(v: MessageView) -> Value:
        lv = le(v)
        if type(lv) is str:
            return lv == text
        if lv is None:
            return None
        c = compare(lv, text, convert)
        return c == 0 if c is not None else False

    def m(v: MessageView) -> bool:
        lv = le(v)
        if type(lv) is str:
            return lv == text
        return lv is not None and ev(v) is True

    # TRUE only for a string equal to ``text`` (a typed value of this name: no pairs)
    return Node(BOOL, ev, pos, m=m, req=_pairs(left, (text,)))


def not_(n: Node, pos: int) -> Node:
    inner = n.ev

    def ev(v: MessageView) -> Value:
        r = inner(v)
        return None if r is None else not r

    return Node(BOOL, ev, pos, m=lambda v: ev(v) is True)


def equals(left: Node, right: Node, convert: bool, pos: int) -> Node:
    if right.kind == CONST and type(right.value) is str and left.kind == PROP:
        return _equals_string(left, right.value, convert, pos)
    le, re_ = left.ev, right.ev

    def ev(v: MessageView) -> Value:
        lv, rv = le(v), re_(v)
        if lv is None or rv is None:
            if lv is None and rv is None:
                return True
            return None if lv is None else False
        c = compare(lv, rv, convert)
        return c == 0 if c is not None else False

    return Node(BOOL, ev, pos)


_ORDER: Final[dict[str, Callable[[int], bool]]] = {
    ">": lambda c: c > 0,
    ">=": lambda c: c >= 0,
    "<": lambda c: c < 0,
    "<=": lambda c: c <= 0,
}


def ordering(op: str, left: Node, right: Node, convert: bool, pos: int) -> Node:
    le, re_, test = left.ev, right.ev, _ORDER[op]

    def ev(v: MessageView) -> Value:
        lv = le(v)
        if lv is None:
            return None
        rv = re_(v)
        if rv is None:
            return None
        c = compare(lv, rv, convert)
        return False if c is None else test(c)

    return Node(BOOL, ev, pos)


def like(left: Node, pattern: str, escape: str | None, pos: int) -> Node:
    out: list[str] = []
    i = 0
    units = pattern
    while i < len(units):
        c = units[i]
        if escape is not None and c == escape and i + 1 < len(units) and units[i + 1] in ("_", "%", escape):
            i += 1
            out.append(re.escape(units[i]))
        elif c == "%":
            out.append(".*?")
        elif c == "_":
            out.append(".")
        else:
            out.append(re.escape(c))
        i += 1
    rx = re.compile("".join(out), re.DOTALL)
    le = left.ev

    def ev(v: MessageView) -> Value:
        r = le(v)
        if r is None:
            return None
        if type(r) is not str:
            return False
        return rx.fullmatch(r) is not None

    return Node(BOOL, ev, pos)


def in_(left: Node, items: list[str], negate: bool, pos: int) -> Node:
    choices = frozenset(items)
    le = left.ev

    def ev(v: MessageView) -> Value:
        r = le(v)
        if r is None or type(r) is not str:
            return None
        return (r in choices) != negate

    return Node(BOOL, ev, pos, req=None if negate else _pairs(left, items))


def arith_node(op: str, left: Node, right: Node, pos: int) -> Node:
    le, re_ = left.ev, right.ev

    def ev(v: MessageView) -> Value:
        lv = le(v)
        if lv is None:
            return None
        rv = re_(v)
        if rv is None:
            return None
        return arith(op, lv, rv)

    return Node(OTHER, ev, pos)

