"""The selector's tokens (ActiveMQ's ``SelectorParser.jj``): the lexer of :mod:`.parser`.

Keywords are case-insensitive; of the token rules that match at a position the longest
wins, equal lengths going to the first in the grammar's order; ``--`` comments end at a
line end, ``/* */`` ones at their close. Anything else is a :class:`SelectorError`
naming the position.
"""

from __future__ import annotations

import re
from typing import Final

from .values import SelectorError

__all__ = ["Token", "tokenize"]


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


class Token:
    __slots__ = ("kind", "text", "pos")

    def __init__(self, kind: str, text: str, pos: int) -> None:
        self.kind, self.text, self.pos = kind, text, pos


def tokenize(text: str) -> list[Token]:
    out: list[Token] = []
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
            out.append(Token("EOF", "", n))
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
        out.append(Token(best[1], text[i : best[0]], i))
        i = best[0]

