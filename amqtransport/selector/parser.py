"""The selector grammar (ActiveMQ's ``SelectorParser.jj``) compiled to closures."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Final

from .jms import JMS_NAMES, MessageView, header_sources
from .values import EvalError, JLong, SelectorError, Value, arith, compare, i32, i64, is_num, negate

__all__ = ["Selector", "compile_selector"]


# ---------------------------------------------------------------------------- tokens
_KEYWORDS = ("NOT", "AND", "OR", "BETWEEN", "LIKE", "ESCAPE", "IN", "IS", "TRUE", "FALSE", "NULL", "XPATH", "XQUERY")
_EXP = r"[eE][+-]?[0-9]+"
_TOKEN_RES: Final = (  # in the grammar's order: equal lengths go to the first
    *((kw, re.compile(kw, re.IGNORECASE)) for kw in _KEYWORDS),
    ("DEC", re.compile(r"[1-9][0-9]*[lL]?")),
    ("HEX", re.compile(r"0[xX][0-9a-fA-F]+")),
    ("OCT", re.compile(r"0[0-7]*")),
    ("FLOAT", re.compile(rf"[0-9]+\.[0-9]*(?:{_EXP})?|\.[0-9]+(?:{_EXP})?|[0-9]+{_EXP}")),
    ("STR", re.compile(r"'(?:''|[^'])*'")),
    ("ID", re.compile(r"[a-zA-Z_$][a-zA-Z0-9_$]*")),
)
_OPS = ("<>", ">=", "<=", "=", ">", "<", "(", ")", ",", "+", "-", "*", "/", "%")
_SPACE = " \t\n\r\f"
_LINE_COMMENT = re.compile(r"--[^\n\r]*(?:\n|\r)")
_BLOCK_COMMENT = re.compile(r"/\*[^*]*\*+(?:[^*/][^*]*\*+)*/")


class _Tok:
    __slots__ = ("kind", "text", "pos")

    def __init__(self, kind: str, text: str, pos: int) -> None:
        self.kind, self.text, self.pos = kind, text, pos


def _tokenize(text: str) -> list[_Tok]:
    out: list[_Tok] = []
    i, n = 0, len(text)
    while True:
        while i < n:
            if text[i] in _SPACE:
                i += 1
                continue
            m = _LINE_COMMENT.match(text, i) or _BLOCK_COMMENT.match(text, i)
            if m is None:
                break
            i = m.end()
        if i >= n:
            out.append(_Tok("EOF", "", n))
            return out
        best: tuple[int, str] | None = None
        for kind, rx in _TOKEN_RES:
            m = rx.match(text, i)
            if m is not None and (best is None or m.end() > best[0]):
                best = (m.end(), kind)
        if best is None:
            for op in _OPS:
                if text.startswith(op, i):
                    best = (i + len(op), op)
                    break
        if best is None:
            ch = text[i]
            what = "an unterminated string" if ch == "'" else f"unexpected character {ch!r}"
            raise SelectorError(what, text, i)
        out.append(_Tok(best[1], text[i : best[0]], i))
        i = best[0]


# ---------------------------------------------------------------------------- the tree
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


class _Node:
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


class _Parser:
    def __init__(self, text: str, convert: bool) -> None:
        self.text = text
        self.toks = _tokenize(text)
        self.i = 0
        self.convert = convert

    # -- token helpers
    @property
    def tok(self) -> _Tok:
        return self.toks[self.i]

    def peek(self, k: int = 1) -> _Tok:
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def take(self) -> _Tok:
        t = self.toks[self.i]
        if t.kind != "EOF":
            self.i += 1
        return t

    def fail(self, detail: str, pos: int | None = None) -> SelectorError:
        return SelectorError(detail, self.text, self.tok.pos if pos is None else pos)

    def unexpected(self, wanted: str) -> SelectorError:
        t = self.tok
        got = "the end of the selector" if t.kind == "EOF" else repr(t.text)
        return self.fail(f"expected {wanted}, found {got}")

    def expect(self, kind: str, wanted: str) -> _Tok:
        if self.tok.kind != kind:
            raise self.unexpected(wanted)
        return self.take()

    # -- checks (ActiveMQ's parse-time RuntimeExceptions)
    def as_bool(self, n: _Node) -> _Node:
        if n.is_bool:
            return n
        if n.kind == PROP:
            ev = n.ev

            def cast(v: MessageView) -> Value:
                r = ev(v)
                return r if r is None or type(r) is bool else False

            return _Node(BOOL, cast, n.pos)
        raise self.fail("expression will not result in a boolean value", n.pos)

    def check_lt(self, n: _Node) -> None:
        if n.kind == CONST:
            if not is_num(n.value) or type(n.value) is bool:
                raise self.fail(f"value {self.text_of(n)} cannot be compared with <, <=, > or >=", n.pos)
        elif n.kind == BOOL:
            raise self.fail("a boolean expression cannot be compared with <, <=, > or >=", n.pos)

    def check_eq(self, n: _Node) -> None:
        if n.kind == CONST and n.value is None:
            raise self.fail("NULL cannot be compared with = or <> (use IS NULL)", n.pos)

    def text_of(self, n: _Node) -> str:
        v = n.value
        if isinstance(v, str):
            return repr(v)
        return "TRUE" if v is True else "FALSE" if v is False else str(v)

    # -- grammar
    def selector(self) -> _Node:
        n = self.or_expr()
        if self.tok.kind != "EOF":
            raise self.unexpected("an operator or the end of the selector")
        return self.as_bool(n)

    def or_expr(self) -> _Node:
        left = self.and_expr()
        parts: list[_Node] | None = None
        while self.tok.kind == "OR":
            self.take()
            right = self.and_expr()
            if parts is None:
                parts = [self.as_bool(left)]
            parts.append(self.as_bool(right))
        return left if parts is None else _logic(parts, is_and=False)

    def and_expr(self) -> _Node:
        left = self.eq_expr()
        parts: list[_Node] | None = None
        while self.tok.kind == "AND":
            self.take()
            right = self.eq_expr()
            if parts is None:
                parts = [self.as_bool(left)]
            parts.append(self.as_bool(right))
        return left if parts is None else _logic(parts, is_and=True)

    def eq_expr(self) -> _Node:
        left = self.cmp_expr()
        while True:
            k = self.tok.kind
            if k in ("=", "<>"):
                op = self.take()
                right = self.cmp_expr()
                self.check_eq(left)
                self.check_eq(right)
                if left.kind == CONST and right.kind == CONST and left.is_bool and not right.is_bool:
                    raise self.fail(f"{self.text_of(left)} cannot be compared with {self.text_of(right)}", op.pos)
                left = _equals(left, right, self.convert, op.pos)
                if k == "<>":
                    left = _not(left, op.pos)
            elif k == "IS":
                pos = self.take().pos
                if self.tok.kind == "NULL":
                    self.take()
                    left = _equals(left, _const(None, pos), self.convert, pos)
                elif self.tok.kind == "NOT":
                    self.take()
                    self.expect("NULL", "NULL after IS NOT")
                    left = _not(_equals(left, _const(None, pos), self.convert, pos), pos)
                else:
                    raise self.unexpected("NULL or NOT NULL after IS")
            else:
                return left

    def cmp_expr(self) -> _Node:
        left = self.add_expr()
        while True:
            k = self.tok.kind
            negate = False
            if k == "NOT" and self.peek().kind in ("LIKE", "BETWEEN", "IN"):
                self.take()
                negate = True
                k = self.tok.kind
            if k in (">", ">=", "<", "<="):
                op = self.take()
                right = self.add_expr()
                self.check_lt(left)
                self.check_lt(right)
                left = _ordering(k, left, right, self.convert, op.pos)
            elif k == "LIKE":
                pos = self.take().pos
                pattern = self.string_literal()
                escape: str | None = None
                esc_pos = self.tok.pos
                if self.tok.kind == "ESCAPE":
                    self.take()
                    esc_pos = self.tok.pos
                    escape = self.string_literal()
                    if len(escape.encode("utf-16-le", "surrogatepass")) != 2:
                        raise self.fail(f"the ESCAPE string must be one character, got {escape!r}", esc_pos)
                left = _like(left, pattern, escape, pos)
                if negate:
                    left = _not(left, pos)
            elif k == "BETWEEN":
                pos = self.take().pos
                low = self.add_expr()
                self.expect("AND", "AND in BETWEEN ... AND ...")
                high = self.add_expr()
                for n in (left, low, high):
                    self.check_lt(n)
                if negate:
                    left = _logic([_ordering("<", left, low, self.convert, pos), _ordering(">", left, high, self.convert, pos)], is_and=False)
                else:
                    left = _logic([_ordering(">=", left, low, self.convert, pos), _ordering("<=", left, high, self.convert, pos)], is_and=True)
            elif k == "IN":
                pos = self.take().pos
                self.expect("(", "'(' after IN")
                items = [self.string_literal()]
                while self.tok.kind == ",":
                    self.take()
                    items.append(self.string_literal())
                self.expect(")", "',' or ')' in the IN list")
                if left.kind != PROP:
                    raise self.fail("IN needs a property on its left", left.pos)
                left = _in(left, items, negate, pos)
            else:
                return left

    def add_expr(self) -> _Node:
        left = self.mult_expr()
        while self.tok.kind in ("+", "-"):
            op = self.take()
            right = self.mult_expr()
            left = _arith_node(op.text, left, right, left.pos)
        return left

    def mult_expr(self) -> _Node:
        left = self.unary_expr()
        while self.tok.kind in ("*", "/", "%"):
            op = self.take()
            right = self.unary_expr()
            left = _arith_node(op.text, left, right, left.pos)
        return left

    def unary_expr(self) -> _Node:
        t = self.tok
        if t.kind == "+":
            self.take()
            return self.unary_expr()
        if t.kind == "-":
            self.take()
            inner = self.unary_expr()
            ev = inner.ev
            return _Node(OTHER, lambda v: negate(ev(v)), t.pos)
        if t.kind == "NOT":
            self.take()
            return _not(self.as_bool(self.unary_expr()), t.pos)
        if t.kind in ("XPATH", "XQUERY"):
            raise self.fail(f"{t.text.upper()} selectors are not supported")
        if t.kind == "ID" and self.peek().kind == "(":
            raise self.fail(f"function calls ({t.text}(...)) are not supported")
        return self.primary()

    def primary(self) -> _Node:
        t = self.tok
        k = t.kind
        if k == "(":
            self.take()
            n = self.or_expr()
            self.expect(")", "')'")
            return n
        if k == "ID":
            self.take()
            return _prop(t.text, t.pos)
        if k == "STR":
            return _const(self.string_literal(), t.pos)
        if k in ("DEC", "HEX", "OCT", "FLOAT"):
            self.take()
            return _const(self.number(t), t.pos)
        if k in ("TRUE", "FALSE", "NULL"):
            self.take()
            return _const({"TRUE": True, "FALSE": False, "NULL": None}[k], t.pos)
        raise self.unexpected("a property, a literal or '('")

    def string_literal(self) -> str:
        t = self.expect("STR", "a string literal")
        return t.text[1:-1].replace("''", "'")

    def number(self, t: _Tok) -> Value:
        s = t.text
        if t.kind == "FLOAT":
            return float(s)
        try:
            if t.kind == "DEC":
                s = s.rstrip("lL")
                v = int(s)
                if v >= 1 << 63:
                    low = i64(v)
                    return i32(v) if -(1 << 31) <= low < 1 << 31 else Decimal(s)
            else:
                v = int(s[2:], 16) if t.kind == "HEX" else int(s, 8)
                if v >= 1 << 63:
                    raise ValueError
        except ValueError:
            raise self.fail(f"number {t.text} is too large", t.pos) from None
        return v if v < 1 << 31 else JLong(v)


def _const(value: Value, pos: int) -> _Node:
    return _Node(CONST, lambda _v: value, pos, value=value)


def _prop(name: str, pos: int) -> _Node:
    if name in JMS_NAMES:
        return _Node(PROP, lambda v: v.jms.get(name), pos, value=name)
    return _Node(PROP, lambda v: v.props.get(name), pos, value=name)


def _required_of(parts: Sequence[_Node], *, is_and: bool) -> Required:
    """AND: any part's pairs will do (each part must be TRUE), the fewest; OR: every part's."""
    reqs = [p.req for p in parts]
    if is_and:
        known = [r for r in reqs if r is not None]
        return min(known, key=len) if known else None
    if any(r is None for r in reqs):
        return None
    return tuple(pair for r in reqs if r is not None for pair in r)


def _pairs(left: _Node, values: Sequence[str]) -> Required:
    """``left`` is a property that equals one of ``values`` (a string each)."""
    sources = header_sources(left.value) if left.kind == PROP and isinstance(left.value, str) else None
    if sources is None:
        return None
    return tuple((h, text) for text in values for h in sources)


def _logic(parts: Sequence[_Node], *, is_and: bool) -> _Node:
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

    return _Node(BOOL, ev, parts[0].pos, m=m, req=_required_of(parts, is_and=is_and))


def _equals_string(left: _Node, text: str, convert: bool, pos: int) -> _Node:
    """``prop = 'text'``, the commonest selector: a string property compared without
    :func:`compare` (any other type of value goes through it, as in :func:`_equals`)."""
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
    return _Node(BOOL, ev, pos, m=m, req=_pairs(left, (text,)))


def _not(n: _Node, pos: int) -> _Node:
    inner = n.ev

    def ev(v: MessageView) -> Value:
        r = inner(v)
        return None if r is None else not r

    return _Node(BOOL, ev, pos, m=lambda v: ev(v) is True)


def _equals(left: _Node, right: _Node, convert: bool, pos: int) -> _Node:
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

    return _Node(BOOL, ev, pos)


_ORDER: Final[dict[str, Callable[[int], bool]]] = {
    ">": lambda c: c > 0,
    ">=": lambda c: c >= 0,
    "<": lambda c: c < 0,
    "<=": lambda c: c <= 0,
}


def _ordering(op: str, left: _Node, right: _Node, convert: bool, pos: int) -> _Node:
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

    return _Node(BOOL, ev, pos)


def _like(left: _Node, pattern: str, escape: str | None, pos: int) -> _Node:
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

    return _Node(BOOL, ev, pos)


def _in(left: _Node, items: list[str], negate: bool, pos: int) -> _Node:
    choices = frozenset(items)
    le = left.ev

    def ev(v: MessageView) -> Value:
        r = le(v)
        if r is None or type(r) is not str:
            return None
        return (r in choices) != negate

    return _Node(BOOL, ev, pos, req=None if negate else _pairs(left, items))


def _arith_node(op: str, left: _Node, right: _Node, pos: int) -> _Node:
    le, re_ = left.ev, right.ev

    def ev(v: MessageView) -> Value:
        lv = le(v)
        if lv is None:
            return None
        rv = re_(v)
        if rv is None:
            return None
        return arith(op, lv, rv)

    return _Node(OTHER, ev, pos)


class Selector:
    """A compiled selector: :meth:`matches` a :class:`MessageView`."""

    __slots__ = ("text", "_m", "required")

    def __init__(self, text: str, root: _Node) -> None:
        self.text = text
        self._m = root.m
        #: ``(header, value)`` pairs, one of which a message matching the selector holds
        #: (None: none implied): from ``prop = 'text'``, ``prop IN (...)`` (jms.header_sources),
        #: through AND (any part) and OR (every part). The byte test of broker/dispatch/scan.py.
        self.required: Required = root.req

    def matches(self, view: MessageView) -> bool:
        """True when the selector is TRUE for the message (null, FALSE or an evaluation error: False)."""
        try:
            return self._m(view)
        except EvalError:
            return False

    def evaluate(self, view: MessageView) -> bool | None:
        """``matches``, but an evaluation error is None (ActiveMQ's RuntimeException)."""
        try:
            return self._m(view)
        except EvalError:
            return None

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"


def compile_selector(text: str, *, convert_strings: bool = True) -> Selector:
    """Parse ``text`` (a SUBSCRIBE's ``selector`` header). ``convert_strings`` is the flag
    ActiveMQ's STOMP connector sets (strings compared with numbers are converted).

    Raises :class:`SelectorError` (and nothing else) naming the position of the problem."""
    try:
        root = _Parser(text, convert_strings).selector()
    except RecursionError:
        raise SelectorError("too deeply nested", text, 0) from None
    return Selector(text, root)


