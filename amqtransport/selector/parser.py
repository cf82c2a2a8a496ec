"""The selector grammar (ActiveMQ's ``SelectorParser.jj``) compiled to closures: a
recursive descent over :mod:`.tokens` that makes its parse-time checks and builds the
tree of :mod:`.nodes`; :func:`compile_selector` and the :class:`Selector` it returns."""

from __future__ import annotations

from decimal import Decimal

from .jms import MessageView
from .nodes import (
    BOOL,
    CONST,
    OTHER,
    PROP,
    Node,
    Required,
    arith_node,
    const,
    equals,
    in_,
    like,
    logic,
    not_,
    ordering,
    prop,
)
from .tokens import Token, tokenize
from .values import EvalError, JLong, SelectorError, Value, i32, i64, is_num, negate

__all__ = ["Selector", "compile_selector"]


class _Parser:
    def __init__(self, text: str, convert: bool) -> None:
        self.text = text
        self.toks = tokenize(text)
        self.i = 0
        self.convert = convert

    # -- token helpers
    @property
    def tok(self) -> Token:
        return self.toks[self.i]

    def peek(self, k: int = 1) -> Token:
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def take(self) -> Token:
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

    def expect(self, kind: str, wanted: str) -> Token:
        if self.tok.kind != kind:
            raise self.unexpected(wanted)
        return self.take()

    # -- checks (ActiveMQ's parse-time RuntimeExceptions)
    def as_bool(self, n: Node) -> Node:
        if n.is_bool:
            return n
        if n.kind == PROP:
            ev = n.ev

            def cast(v: MessageView) -> Value:
                r = ev(v)
                return r if r is None or type(r) is bool else False

            return Node(BOOL, cast, n.pos)
        raise self.fail("expression will not result in a boolean value", n.pos)

    def check_lt(self, n: Node) -> None:
        if n.kind == CONST:
            if not is_num(n.value) or type(n.value) is bool:
                raise self.fail(f"value {self.text_of(n)} cannot be compared with <, <=, > or >=", n.pos)
        elif n.kind == BOOL:
            raise self.fail("a boolean expression cannot be compared with <, <=, > or >=", n.pos)

    def check_eq(self, n: Node) -> None:
        if n.kind == CONST and n.value is None:
            raise self.fail("NULL cannot be compared with = or <> (use IS NULL)", n.pos)

    def text_of(self, n: Node) -> str:
        v = n.value
        if isinstance(v, str):
            return repr(v)
        return "TRUE" if v is True else "FALSE" if v is False else str(v)

    # -- grammar
    def selector(self) -> Node:
        n = self.or_expr()
        if self.tok.kind != "EOF":
            raise self.unexpected("an operator or the end of the selector")
        return self.as_bool(n)

    def or_expr(self) -> Node:
        left = self.and_expr()
        parts: list[Node] | None = None
        while self.tok.kind == "OR":
            self.take()
            right = self.and_expr()
            if parts is None:
                parts = [self.as_bool(left)]
            parts.append(self.as_bool(right))
        return left if parts is None else logic(parts, is_and=False)

    def and_expr(self) -> Node:
        left = self.eq_expr()
        parts: list[Node] | None = None
        while self.tok.kind == "AND":
            self.take()
            right = self.eq_expr()
            if parts is None:
                parts = [self.as_bool(left)]
            parts.append(self.as_bool(right))
        return left if parts is None else logic(parts, is_and=True)

    def eq_expr(self) -> Node:
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
                left = equals(left, right, self.convert, op.pos)
                if k == "<>":
                    left = not_(left, op.pos)
            elif k == "IS":
                pos = self.take().pos
                if self.tok.kind == "NULL":
                    self.take()
                    left = equals(left, const(None, pos), self.convert, pos)
                elif self.tok.kind == "NOT":
                    self.take()
                    self.expect("NULL", "NULL after IS NOT")
                    left = not_(equals(left, const(None, pos), self.convert, pos), pos)
                else:
                    raise self.unexpected("NULL or NOT NULL after IS")
            else:
                return left

    def cmp_expr(self) -> Node:
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
                left = ordering(k, left, right, self.convert, op.pos)
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
                left = like(left, pattern, escape, pos)
                if negate:
                    left = not_(left, pos)
            elif k == "BETWEEN":
                pos = self.take().pos
                low = self.add_expr()
                self.expect("AND", "AND in BETWEEN ... AND ...")
                high = self.add_expr()
                for n in (left, low, high):
                    self.check_lt(n)
                if negate:
                    left = logic([ordering("<", left, low, self.convert, pos), ordering(">", left, high, self.convert, pos)], is_and=False)
                else:
                    left = logic([ordering(">=", left, low, self.convert, pos), ordering("<=", left, high, self.convert, pos)], is_and=True)
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
                left = in_(left, items, negate, pos)
            else:
                return left

    def add_expr(self) -> Node:
        left = self.mult_expr()
        while self.tok.kind in ("+", "-"):
            op = self.take()
            right = self.mult_expr()
            left = arith_node(op.text, left, right, left.pos)
        return left

    def mult_expr(self) -> Node:
        left = self.unary_expr()
        while self.tok.kind in ("*", "/", "%"):
            op = self.take()
            right = self.unary_expr()
            left = arith_node(op.text, left, right, left.pos)
        return left

    def unary_expr(self) -> Node:
        t = self.tok
        if t.kind == "+":
            self.take()
            return self.unary_expr()
        if t.kind == "-":
            self.take()
            inner = self.unary_expr()
            ev = inner.ev
            return Node(OTHER, lambda v: negate(ev(v)), t.pos)
        if t.kind == "NOT":
            self.take()
            return not_(self.as_bool(self.unary_expr()), t.pos)
        if t.kind in ("XPATH", "XQUERY"):
            raise self.fail(f"{t.text.upper()} selectors are not supported")
        if t.kind == "ID" and self.peek().kind == "(":
            raise self.fail(f"function calls ({t.text}(...)) are not supported")
        return self.primary()

    def primary(self) -> Node:
        t = self.tok
        k = t.kind
        if k == "(":
            self.take()
            n = self.or_expr()
            self.expect(")", "')'")
            return n
        if k == "ID":
            self.take()
            return prop(t.text, t.pos)
        if k == "STR":
            return const(self.string_literal(), t.pos)
        if k in ("DEC", "HEX", "OCT", "FLOAT"):
            self.take()
            return const(self.number(t), t.pos)
        if k in ("TRUE", "FALSE", "NULL"):
            self.take()
            return const({"TRUE": True, "FALSE": False, "NULL": None}[k], t.pos)
        raise self.unexpected("a property, a literal or '('")

    def string_literal(self) -> str:
        t = self.expect("STR", "a string literal")
        return t.text[1:-1].replace("''", "'")

    def number(self, t: Token) -> Value:
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



class Selector:
    """A compiled selector: :meth:`matches` a :class:`MessageView`."""

    __slots__ = ("text", "_m", "required")

    def __init__(self, text: str, root: Node) -> None:
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


