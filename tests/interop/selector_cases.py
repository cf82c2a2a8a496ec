"""Generated selectors and messages for the differential selector test (seeded, deterministic).

The generator writes expressions from ActiveMQ's grammar over a small vocabulary of
properties whose STOMP values are strings (numbers, decimals, words, booleans, odd
spellings such as ``' 7'`` or ``'0x10'``), the JMS headers, literals of every type, and
every operator; a few selectors are deliberately broken (their acceptance is compared
too). Messages carry a random subset of the properties and JMS headers.
"""

from __future__ import annotations

import random

PROPS = ("a", "b", "color", "price", "n", "flag", "s")
WORDS = ("red", "blue", "Red", "r%d", "x_y", "it's", "é", "")
NUMBERS = ("0", "1", "2", "7", "-3", "10", "20", "007", "+3", "2.5", "1e3", " 7", "0x10", "3000000000", "NaN", "Infinity", "1.0")
BOOLS = ("true", "TRUE", "false", "yes")


def gen_message(rng: random.Random, i: int) -> dict[str, str]:
    """Headers of one message (every value a string, as STOMP sends them)."""
    headers: dict[str, str] = {}
    for p in PROPS:
        if rng.random() < 0.7:
            pool = rng.choice((WORDS, NUMBERS, NUMBERS, BOOLS))
            headers[p] = rng.choice(pool)
    if rng.random() < 0.5:
        headers["priority"] = str(rng.randint(0, 9))
    if rng.random() < 0.5:
        headers["type"] = rng.choice(("t1", "t2", "order"))
    if rng.random() < 0.5:
        headers["correlation-id"] = rng.choice(("c1", "c2", "corr-9"))
    headers["idx"] = str(i)
    return headers


class SelectorGen:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def literal(self) -> str:
        r = self.rng
        kind = r.randrange(7)
        if kind == 0:
            return str(r.choice((0, 1, 2, 3, 7, 10, 20, -1, 2147483647)))
        if kind == 1:
            return r.choice(("2.5", "1.0", "0.5", "1e3", "10.0", ".5", "7."))
        if kind == 2:
            return r.choice(("3000000000", "10L", "0x10", "010", "0"))
        if kind == 3:
            return r.choice(("TRUE", "FALSE"))
        word = r.choice(("red", "blue", "7", "2.5", "true", "abc", "it''s", "", "20", "1e3"))
        return f"'{word}'"

    def value(self, depth: int) -> str:
        r = self.rng
        roll = r.random()
        if depth <= 0 or roll < 0.45:
            return r.choice(PROPS) if r.random() < 0.6 else self.literal()
        if roll < 0.6:
            return r.choice(("JMSPriority", "JMSType", "JMSCorrelationID", "JMSDeliveryMode", "JMSTimestamp",
                             "JMSExpiration", "JMSRedelivered", "JMSXDeliveryCount", "JMSMessageID"))
        if roll < 0.8:
            op = r.choice(("+", "-", "*", "/", "%"))
            return f"{self.value(depth - 1)} {op} {self.value(depth - 1)}"
        if roll < 0.9:
            return f"-{self.value(depth - 1)}"
        return f"({self.value(depth - 1)})"

    def boolean(self, depth: int) -> str:
        r = self.rng
        roll = r.randrange(12)
        if depth <= 0:
            roll = r.randrange(7)
        if roll == 0:
            op = r.choice(("=", "<>", "<", ">", "<=", ">="))
            return f"{self.value(depth - 1)} {op} {self.value(depth - 1)}"
        if roll == 1:
            pat = r.choice(("r%", "%e%", "_ed", "b__e", "x!_y", "%", "it''%", "R%", "2%"))
            esc = " ESCAPE '!'" if "!" in pat or r.random() < 0.2 else ""
            neg = "NOT " if r.random() < 0.3 else ""
            return f"{r.choice(PROPS + ('JMSType', 'JMSCorrelationID'))} {neg}LIKE '{pat}'{esc}"
        if roll == 2:
            items = ", ".join(f"'{w}'" for w in r.sample(("red", "blue", "7", "true", "t1", "c1", "x"), r.randint(1, 3)))
            neg = "NOT " if r.random() < 0.3 else ""
            return f"{r.choice(PROPS + ('JMSType',))} {neg}IN ({items})"
        if roll == 3:
            neg = "NOT " if r.random() < 0.3 else ""
            lo, hi = sorted((r.randint(-2, 12), r.randint(-2, 12)))
            return f"{self.value(depth - 1)} {neg}BETWEEN {lo} AND {hi}"
        if roll == 4:
            return f"{self.value(depth - 1)} IS {'NOT ' if r.random() < 0.5 else ''}NULL"
        if roll == 5:
            return r.choice(PROPS + ("JMSRedelivered", "TRUE", "FALSE"))
        if roll == 6:
            return r.choice(("JMSPriority > 4", "JMSDeliveryMode = 'PERSISTENT'", "JMSMessageID LIKE 'ID:%'",
                             "JMSTimestamp > 0", "JMSExpiration = 0", "JMSXDeliveryCount = 1", "JMSType = 't1'"))
        if roll in (7, 8):
            return f"{self.boolean(depth - 1)} {r.choice(('AND', 'OR'))} {self.boolean(depth - 1)}"
        if roll == 9:
            return f"NOT {self.boolean(depth - 1)}"
        if roll == 10:
            return f"({self.boolean(depth - 1)})"
        return f"NOT {r.choice(PROPS)} = {self.value(0)}"  # ActiveMQ's NOT binds tighter than =

    def selector(self) -> str:
        text = self.boolean(3)
        if self.rng.random() < 0.08:  # break it: acceptance is compared too
            cut = self.rng.randrange(1, max(2, len(text)))
            text = text[:cut] + self.rng.choice(("=", ")", "(", " AND", "'", " IN", "")) + text[cut:]
        return text


SOUP = ("a", "b", "JMSPriority", "JMSRedelivered", "'x'", "''", "'it''s'", "1", "0", "2.5", "1e3", "0x1F", "010", "5L",
        ".5", "7.", "99999999999999999999", "TRUE", "FALSE", "NULL", "NOT", "AND", "OR", "IS", "IN", "LIKE", "ESCAPE",
        "not", "Is", "nulL", "BETWEEN", "=", "<>", "<", ">", "<=", ">=", "+", "-", "*", "/", "%", "(", ")", ",", "'%'",
        "'!'", "--c\n", "/*c*/", "$x", "_y")


def token_soup(rng: random.Random) -> str:
    """A few grammar tokens in any order: most do not parse; the point is that ActiveMQ
    and we accept and refuse the same ones."""
    return " ".join(rng.choice(SOUP) for _ in range(rng.randint(1, 5)))
