"""Java's values in a selector: the types, comparisons with ActiveMQ's conversions,
arithmetic and String.valueOf (see the package docstring for the rules)."""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any

from amqtransport.errors import AmqTransportError

__all__ = ["EvalError", "JLong", "NumberFormat", "SelectorError", "Value", "arith", "compare", "is_num",
           "negate", "parse_double", "parse_int"]


class SelectorError(AmqTransportError, ValueError):
    """A selector that does not parse; ``position`` is the 0-based offset of the problem."""

    def __init__(self, detail: str, text: str, position: int) -> None:
        self.detail = detail
        self.text = text
        self.position = position
        line = text.count("\n", 0, position) + 1
        column = position - (text.rfind("\n", 0, position) + 1) + 1
        where = f"column {column}" if line == 1 else f"line {line}, column {column}"
        shown = text if len(text) <= 200 else text[:200] + "..."
        super().__init__(f"invalid selector {shown!r} at {where}: {detail}")


class EvalError(AmqTransportError):
    """A Java RuntimeException while evaluating (never leaves this module)."""


class JLong(int):
    """A Java Long (a plain ``int`` is a Java Integer)."""

    __slots__ = ()


Value = Any  # None | bool | str | int | JLong | float | Decimal
_I32, _I64 = 1 << 32, 1 << 64


def i32(v: int) -> int:
    v &= _I32 - 1
    return v - _I32 if v >= 1 << 31 else v


def i64(v: int) -> JLong:
    v &= _I64 - 1
    return JLong(v - _I64 if v >= 1 << 63 else v)


# ---------------------------------------------------------------------------- values
_JAVA_INT = re.compile(r"[+-]?\d+")
_JAVA_DOUBLE = re.compile(
    r"[+-]?(?:NaN|Infinity|(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)[fFdD]?"
    r"|0[xX](?:[0-9a-fA-F]+\.?|[0-9a-fA-F]*\.[0-9a-fA-F]+)[pP][+-]?[0-9]+[fFdD]?)"
)


class NumberFormat(AmqTransportError):  # noqa: N818 - Java's NumberFormatException, caught inside compare
    pass


def parse_int(s: str, bits: int) -> int:
    if not _JAVA_INT.fullmatch(s):
        raise NumberFormat
    v = int(s)
    if not -(1 << (bits - 1)) <= v < 1 << (bits - 1):
        raise NumberFormat
    return v if bits == 32 else JLong(v)


def parse_double(s: str) -> float:
    t = s.strip("".join(chr(c) for c in range(33)))
    if not _JAVA_DOUBLE.fullmatch(t):
        raise NumberFormat
    if "x" in t or "X" in t:
        body = t.rstrip("fFdD")
        return float.fromhex(body)
    t = t.rstrip("fFdD") if not t.endswith("Infinity") else t
    return float(t.replace("Infinity", "inf"))


def is_num(v: Value) -> bool:
    t = type(v)
    return t is int or t is JLong or t is float or t is Decimal


def _dcmp(a: float, b: float) -> int:
    """Java's Double.compare: NaN above everything and equal to itself, -0.0 < 0.0."""
    if a < b:
        return -1
    if a > b:
        return 1
    an, bn = a != a, b != b
    if an or bn:
        return int(an) - int(bn)
    if a == 0.0:
        sa, sb = math.copysign(1.0, a), math.copysign(1.0, b)
        return (sa > sb) - (sa < sb)
    return 0


def _scmp(a: str, b: str) -> int:
    """Java's String.compareTo: UTF-16 code units."""
    if a == b:
        return 0
    if max(a, default="\0") > "\uffff" or max(b, default="\0") > "\uffff":
        ea, eb = a.encode("utf-16-be", "surrogatepass"), b.encode("utf-16-be", "surrogatepass")
        return (ea > eb) - (ea < eb)
    return (a > b) - (a < b)


def compare(lv: Value, rv: Value, convert: bool) -> int | None:
    """``ComparisonExpression.compare``'s conversions: the sign of lv - rv, or None
    (the comparison is FALSE). Raises EvalError where Java throws."""
    lt, rt = type(lv), type(rv)
    try:
        if lt is not rt:
            if lt is bool:
                if convert and rt is str:
                    raise EvalError("java.lang.ClassCastException: Boolean cannot be cast to String")
                return None
            if lt is int:
                if rt is JLong:
                    pass
                elif rt is float:
                    lv = float(lv)
                elif convert and rt is str:
                    rv = parse_int(rv, 32)
                else:
                    return None
            elif lt is JLong:
                if rt is int:
                    pass
                elif rt is float:
                    lv = float(lv)
                elif convert and rt is str:
                    rv = parse_int(rv, 64)
                else:
                    return None
            elif lt is float:
                if rt is int or rt is JLong:
                    rv = float(rv)
                elif convert and rt is str:
                    rv = parse_double(rv)
                else:
                    return None
            elif convert and lt is str:
                if rt is bool:
                    lv = lv.lower() == "true"
                elif rt is int:
                    lv = parse_int(lv, 32)
                elif rt is JLong:
                    lv = parse_int(lv, 64)
                elif rt is float:
                    lv = parse_double(lv)
                else:
                    return None
            else:
                return None
    except NumberFormat:
        return None
    if type(lv) is float:
        return _dcmp(lv, rv)
    if type(lv) is str:
        return _scmp(lv, rv)
    return (lv > rv) - (lv < rv)  # type: ignore[no-any-return]


def java_str(v: Value) -> str:
    """``String.valueOf`` of a selector value (for ``'text' + value``)."""
    t = type(v)
    if t is bool:
        return "true" if v else "false"
    if t is float:
        return _double_str(v)
    return str(v)


def _double_str(d: float) -> str:
    if d != d:
        return "NaN"
    if math.isinf(d):
        return "Infinity" if d > 0 else "-Infinity"
    if d == 0.0:
        return "-0.0" if math.copysign(1.0, d) < 0 else "0.0"
    a = abs(d)
    if 1e-3 <= a < 1e7:
        return repr(d)
    sign, digits, exp = Decimal(repr(a)).normalize().as_tuple()
    ds = "".join(map(str, digits))
    e10 = exp + len(ds) - 1  # type: ignore[operator]
    mant = ds[0] + "." + (ds[1:] or "0")
    return f"{'-' if d < 0 else ''}{mant}E{e10}"


def _int_value(v: Value) -> int:
    return i32(int(v))


def _long_value(v: Value) -> int:
    return int(i64(int(v)))


def arith(op: str, lv: Value, rv: Value) -> Value:
    if op == "+" and type(lv) is str:
        return lv + java_str(rv)
    if not is_num(lv) or type(lv) is bool:
        raise EvalError(f"Cannot call {op} operation on: {lv!r}")
    if not is_num(rv):
        raise EvalError(f"Cannot convert value: {rv!r} into a number")
    if op in "/%":
        a, b = float(lv), float(rv)
        if op == "/":
            if b == 0.0:
                if a != a or a == 0.0:
                    return math.nan
                return math.copysign(math.inf, a) * math.copysign(1.0, b)
            return a / b
        if b == 0.0 or math.isinf(a) or a != a or b != b:
            return math.nan
        if math.isinf(b):
            return a
        return math.fmod(a, b)
    lt, rt = type(lv), type(rv)
    if lt is float or rt is float:
        a, b = float(lv), float(rv)
        return a + b if op == "+" else a - b if op == "-" else a * b
    if lt is JLong or rt is JLong:
        x, y = _long_value(lv), _long_value(rv)
        return i64(x + y if op == "+" else x - y if op == "-" else x * y)
    x, y = _int_value(lv), _int_value(rv)
    return i32(x + y if op == "+" else x - y if op == "-" else x * y)


def negate(v: Value) -> Value:
    t = type(v)
    if t is int:
        return i32(-v)
    if t is JLong:
        return i64(-v)
    if t is float:
        return -v
    if t is Decimal:
        r = -v
        return JLong(-(1 << 63)) if r == -(1 << 63) else r
    return None


