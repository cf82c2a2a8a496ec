"""Connection URI grammar: ActiveMQ-style composite URIs parsed into a frozen tree.

Theory of operation
-------------------
``parse_uri(text)`` returns a tree of :class:`LeafUri` (one broker: ``tcp://``,
``ssl://``, ``vm://``) and :class:`CompositeUri` (``failover`` or ``static``) nodes,
after desugaring.  It raises :class:`~amqtransport.errors.UriError` and nothing else.

1. The whole text is checked once: surrounding whitespace is dropped, any other
   non-printable character is refused, and parentheses are matched (an unmatched one is
   reported with its 1-based column).  The matching table is kept, so ``(`` -> ``)`` is
   a lookup afterwards.
2. A node starts with ``scheme:``.  Composite schemes (``failover``, ``static``,
   ``masterslave``) take an optional ``//`` and then either a parenthesised list
   ``(u1,u2,...)?options`` or the parenthesis-free form:

   * ``static:failover:(...)?q`` (the rest starts with a composite scheme) is a prefix
     chain: the rest is the single component and ``?q`` belongs to the inner node;
   * ``failover:u1,u2?q`` (the rest is a list of broker URIs) is a list; the ``?q``
     after the last broker URI belongs to the *composite*, so the last broker URI of a
     parenthesis-free list cannot carry options of its own (use parentheses).  This is
     a deliberate choice: ActiveMQ 5.17's ``URISupport.parseComposite`` gives that
     ``?q`` to the last broker URI, which then rejects failover options; since the two
     option sets share no name, a URI that means something in ActiveMQ either means
     the same here or is rejected with a message, never silently reinterpreted.

   Lists are split on commas at parenthesis depth 0; a piece that does not start with
   ``scheme:`` and follows a piece holding ``?`` is glued back (a comma inside an
   option value, e.g. ``heartBeat=5000,5000``).
3. Options are split on ``&``, keys and values URL-decoded (``+`` is a space, as in
   ActiveMQ), looked up by ActiveMQ's rules in ``activemq_options.py`` (ActiveMQ 5.17's
   client options, values checked as Java converts them) and in the model's names
   (unknown / duplicate names are errors that list the valid ones); options that set a
   field are validated by the pydantic model (a ``ValidationError`` becomes a
   ``UriError`` naming the option), the others are kept as written (``.amq``).
4. Desugaring: ``masterslave:(a,b,...)`` (two or more broker URIs) becomes exactly
   ``static:(failover:(a,b,...)?randomize=false&maxReconnectAttempts=0)``; options
   given to ``masterslave:`` are ``static:`` options (ActiveMQ's MasterSlaveDiscoveryAgent
   is a SimpleDiscoveryAgent) and go to the outer static.  ``nested.X=v`` on a
   failover is applied to every broker URI below it (an option written on the broker
   URI itself wins) and disappears from the tree.
5. Structure rules: ``failover:`` lists broker URIs only; ``static:`` lists broker URIs
   or failovers (a static inside a static means nothing).  Nesting depth is bounded.

``str(node)`` is the canonical URI: parentheses always, lowercase canonical schemes
(``stomp`` -> ``tcp``), explicit ports, IPv6 hosts in brackets, and exactly the options
that were given, in model field order.  It parses back to an equal tree.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias
from urllib.parse import quote, unquote_plus

import yarl
from pydantic import BaseModel, ValidationError

import amqtransport.activemq_options as amq
from amqtransport.errors import UriError
from amqtransport.options import (
    SSL_ONLY_OPTIONS,
    FailoverOptions,
    LeafOptions,
    StaticOptions,
    activemq_name,
    option_names,
)

__all__ = [
    "parse_uri",
    "UriNode",
    "LeafUri",
    "CompositeUri",
    "LEAF_SCHEMES",
    "COMPOSITE_SCHEMES",
    "DEFAULT_PORTS",
]

#: accepted leaf schemes -> canonical scheme
LEAF_SCHEMES: dict[str, str] = {
    "tcp": "tcp",
    "stomp": "tcp",
    "ssl": "ssl",
    "stomp+ssl": "ssl",
    "nio": "tcp",
    "stomp+nio": "tcp",
    "nio+ssl": "ssl",
    "stomp+nio+ssl": "ssl",
    "vm": "vm",
}
COMPOSITE_SCHEMES: tuple[str, ...] = ("failover", "static", "masterslave")
DEFAULT_PORTS: dict[str, int] = {"tcp": 61613, "ssl": 61612, "vm": 0}
ALL_SCHEMES: tuple[str, ...] = (*LEAF_SCHEMES, *COMPOSITE_SCHEMES)

MAX_DEPTH = 8

#: ActiveMQ options without a field in our models, as (name, value), in the order given
Amq: TypeAlias = tuple[tuple[str, str], ...]

_SCHEME_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")
_VM_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
_HOST_RE = re.compile(r"[a-z0-9_](?:[a-z0-9_\-]*)(?:\.[a-z0-9_\-]+)*\.?")
_PORT_RE = re.compile(r"[0-9]{1,5}")
_ZONE_RE = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
#: whitespace allowed around list elements and options (a URI split over lines in a config file)
_WS = " \t\r\n"

# characters left readable in canonical option values (everything else %-encoded)
_SAFE_COMPOSITE = ":/[]@!$'*;,"
_SAFE_LEAF = ":/[]@!$'*;"


def _q(text: str) -> str:
    """Quote a piece of user text for an error message (ASCII, one line)."""
    return ascii(text)


def _encode(value: Any, safe: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        sep = "," if "," in safe else "%2C"
        return sep.join(quote(str(item), safe=safe) for item in value)
    if isinstance(value, float):
        return repr(value)
    return quote(str(value), safe=safe)


def _query(options: BaseModel, amq_options: Amq, *, leaf: bool, nested: bool = False) -> str:
    """Canonical ``k=v&...`` of the given options.

    Commas stay readable where they cannot be mistaken for a list separator: in
    ``heartBeat`` (digits only) and in the options of a top-level composite.  Inside a
    list (a leaf, or a failover inside a static) a comma in a value is written ``%2C``
    and ``priorityURIs`` goes first, never last (see ``_Parser.split``).
    """
    given = options.given() if hasattr(options, "given") else {}
    if nested and "priorityURIs" in given:
        # never end a failover inside a list with priorityURIs=...: the parser refuses a
        # comma right after it as ambiguous, so put it first and something after it
        rest = {k: v for k, v in given.items() if k != "priorityURIs"}
        if not rest:
            rest = {"randomize": getattr(options, "randomize", True)}
        given = {"priorityURIs": given["priorityURIs"], **rest}
    parts = []
    for name, value in given.items():
        if leaf and name == "heartBeat":
            text = str(value)  # validated as digits,digits: a raw comma is safe
        else:
            text = _encode(value, _SAFE_LEAF if (leaf or nested) else _SAFE_COMPOSITE)
        parts.append(f"{name}={text}")
    safe = _SAFE_LEAF if (leaf or nested) else _SAFE_COMPOSITE
    parts.extend(f"{quote(name, safe='.')}={quote(value, safe=safe)}" for name, value in amq_options)
    return "&".join(parts)


@dataclass(frozen=True)
class LeafUri:
    """One broker: ``tcp://host:port``, ``ssl://host:port`` or ``vm://NAME``.

    For ``vm`` leaves ``host`` is ``""``, ``port`` 0 and ``name`` the broker name;
    ``name`` is ``None`` for the others.
    """

    scheme: str
    host: str
    port: int
    name: str | None = None
    options: LeafOptions = field(default_factory=lambda: LeafOptions.model_validate({}))
    #: ActiveMQ options kept as written (activemq_options.py says what each means)
    amq: Amq = ()

    @property
    def address(self) -> str:
        """``tcp://host:port`` (no options): for logs and bridge status."""
        if self.scheme == "vm":
            return f"vm://{self.name}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    def __str__(self) -> str:
        query = _query(self.options, self.amq, leaf=True)
        return f"{self.address}?{query}" if query else self.address

    def to_json(self) -> dict[str, Any]:
        """``{"scheme", "host", "port", "options"}`` (vm: ``{"scheme", "name", "options"}``);
        options are the given ones only, by ActiveMQ name."""
        options = self.options.given()
        head = {"name": self.name} if self.scheme == "vm" else {"host": self.host, "port": self.port}
        meanings = _meanings("transport", self.amq)
        return {"scheme": self.scheme, **head, "options": options, **({"meanings": meanings} if meanings else {})}

    def leaves(self) -> Iterator[LeafUri]:
        yield self


@dataclass(frozen=True)
class CompositeUri:
    """``failover`` or ``static`` over ``components`` (after desugaring).

    ``desugared_from`` is ``"masterslave"`` for the static made from a masterslave URI
    (information for ``amq uri explain``; not part of equality).
    """

    scheme: str
    options: FailoverOptions | StaticOptions
    components: tuple[UriNode, ...]
    desugared_from: str | None = field(default=None, compare=False)
    amq: Amq = ()

    def __str__(self) -> str:
        return self._render(nested=False)

    def _render(self, *, nested: bool) -> str:
        inner = ",".join(
            c._render(nested=True) if isinstance(c, CompositeUri) else str(c)
            for c in self.components
        )
        query = _query(self.options, self.amq, leaf=False, nested=nested)
        return f"{self.scheme}:({inner})" + (f"?{query}" if query else "")

    def to_json(self) -> dict[str, Any]:
        """The explain JSON (docs/uris.md): every effective option by ActiveMQ name."""
        scope: amq.Scope = "failover" if self.scheme == "failover" else "static"
        meanings = _meanings(scope, self.amq)
        return {"scheme": self.scheme, "options": self.options.effective(), **({"meanings": meanings} if meanings else {}),
                "components": [component.to_json() for component in self.components]}

    def leaves(self) -> Iterator[LeafUri]:
        for component in self.components:
            yield from component.leaves()


UriNode: TypeAlias = LeafUri | CompositeUri


def _meanings(scope: amq.Scope, amq_options: Amq) -> dict[str, dict[str, str]]:
    """``{name: {"value", "became" | "ignored"}}`` for the ActiveMQ options kept on a node."""
    return {name: {"value": value, **dict([amq.meaning_of("jms" if name.startswith("jms.") else scope, name)])}
            for name, value in amq_options}


def parse_uri(text: str) -> UriNode:
    """Parse a connection URI into its (desugared) tree; raises ``UriError`` only."""
    if not isinstance(text, str):
        raise UriError(f"a connection URI must be a string, not {type(text).__name__}")
    return _Parser(text).parse()


#: broker URI options also accepted on a failover: (applied to every URI inside that
#: does not set its own, like nested.X)
_LEAF_SHORTHANDS = ("dialect", "vhost")


def _leaf_only(key: str) -> bool:
    """A broker URI option that no composite takes (not even as a shorthand)."""
    if key in _LEAF_SHORTHANDS or key.startswith(("nested.", "jms.")) or amq.lookup("failover", key):
        return False
    names = option_names(LeafOptions)
    return bool(amq.lookup("transport", key) or amq.bean_match(key, names)) and not amq.bean_match(
        key, option_names(FailoverOptions))


@dataclass
class _Option:
    key: str
    value: str
    column: int  # 0-based index of the key in the text


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.match: dict[int, int] = {}

    # ------------------------------------------------------------------ errors
    def error(
        self,
        message: str,
        pos: int | None = None,
        *,
        option: str | None = None,
        valid: Sequence[str] = (),
    ) -> UriError:
        column = None if pos is None else pos + 1
        # one printable line whatever the input held (the CLI prints it as one line)
        full = "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in message)
        if column is not None:
            full += f" (column {column})"
        if valid:
            full += "; valid: " + ", ".join(valid)
        return UriError(full, uri=self.text, option=option, column=column, valid=valid)

    # ------------------------------------------------------------------ entry
    def parse(self) -> UriNode:
        text = self.text
        start = len(text) - len(text.lstrip(_WS))
        end = len(text.rstrip(_WS))
        if start >= end:
            raise self.error("empty URI: expected e.g. failover:(tcp://host:61613,tcp://host2:61613)")
        for i in range(start, end):
            ch = text[i]
            if ch not in _WS and not ch.isprintable():
                raise self.error(f"unexpected character {_q(ch)} in the URI", i)
        self._match_parentheses(start, end)
        node = self.node(start, end, depth=0)
        for leaf in node.leaves():  # after nested.*, as ActiveMQ merges them before it builds the transport
            if clash := amq.conflict(dict(leaf.amq)):  # e.g. a monitor knob and useInactivityMonitor=false
                raise self.error(f"option {_q(clash[0])} {clash[1]} (on {leaf.address})", option=clash[0])
        return node

    def _match_parentheses(self, start: int, end: int) -> None:
        stack: list[int] = []
        for i in range(start, end):
            ch = self.text[i]
            if ch == "(":
                stack.append(i)
            elif ch == ")":
                if not stack:
                    raise self.error("unbalanced parentheses: ')' without a matching '('", i)
                self.match[stack.pop()] = i
        if stack:
            raise self.error("unbalanced parentheses: '(' is never closed", stack[-1])

    # ------------------------------------------------------------------ nodes
    def node(self, s: int, e: int, depth: int) -> UriNode:
        if depth > MAX_DEPTH:
            raise self.error(f"URI nested more than {MAX_DEPTH} levels deep", s)
        m = _SCHEME_RE.match(self.text, s, e)
        if m is None:
            piece = self.text[s:e]
            raise self.error(f"expected a URI such as tcp://host:61613, got {_q(piece[:60])} (no scheme)", s,
                valid=ALL_SCHEMES)
        scheme = m.group(0)[:-1].lower()
        if scheme in COMPOSITE_SCHEMES:
            return self.composite(scheme, s, m.end(), e, depth)
        if scheme in LEAF_SCHEMES:
            return self.leaf(scheme, s, m.end(), e, top=depth == 0)
        raise self.error(f"unknown scheme {_q(scheme)}", s, valid=ALL_SCHEMES)

    def composite(self, scheme: str, s: int, p: int, e: int, depth: int) -> UriNode:
        text = self.text
        if text.startswith("//", p):
            p += 2
        while p < e and text[p] in _WS:
            p += 1
        if p >= e:
            raise self.error(f"{scheme}: needs a list of URIs, e.g. {scheme}:(tcp://a:61613,tcp://b:61613)", p)
        options: list[_Option] = []
        pieces: list[tuple[int, int]]
        if text[p] == "(":
            close = self.match[p]
            if not text[p + 1 : close].strip():
                raise self.error(f"{scheme}: empty list of URIs", p)
            pieces = self.split(p + 1, close)
            rest = close + 1
            while rest < e and text[rest] in _WS:
                rest += 1
            if rest < e:
                if text[rest] != "?":
                    raise self.error(f"unexpected text {_q(text[rest:e][:40])} after ')'", rest)
                options = self.options(rest + 1, e)
        else:
            m = _SCHEME_RE.match(text, p, e)
            if m is not None and m.group(0)[:-1].lower() in COMPOSITE_SCHEMES:
                pieces = [(p, e)]  # prefix chain: static:failover:(...)?q
            else:
                pieces = self.split(p, e)
                ls, le = pieces[-1]
                lm = _SCHEME_RE.match(text, ls, le)
                if lm is None or lm.group(0)[:-1].lower() not in COMPOSITE_SCHEMES:
                    q = text.find("?", ls, le)
                    # only broker options after the last URI: the last URI's, as in ActiveMQ
                    if q >= 0 and not all(_leaf_only(o.key) for o in self.options(q + 1, le)):
                        options = self.options(q + 1, le)
                        le = q
                        while le > ls and text[le - 1] in _WS:
                            le -= 1
                        pieces[-1] = (ls, le)
        components = [self.node(ps, pe, depth + 1) for ps, pe in pieces]
        if scheme == "failover":
            return self.failover(components, pieces, options, top=depth == 0)
        if scheme == "static":
            opts, _ = self.model(StaticOptions, options, "static", "static")
            self.check_static_components(components, pieces)
            return CompositeUri("static", opts, tuple(components))
        # masterslave
        self.check_leaves("masterslave", components, pieces)
        if len(components) < 2:
            raise self.error(
                f"masterslave: needs two or more broker URIs (master and slaves), got {len(components)}",
                s,
            )
        opts, _ = self.model(StaticOptions, options, "masterslave (static)", "static")
        inner = CompositeUri(
            "failover",
            FailoverOptions.model_validate({"randomize": False, "maxReconnectAttempts": 0}),
            tuple(components),
        )
        return CompositeUri("static", opts, (inner,), desugared_from="masterslave")

    def failover(
        self,
        components: list[UriNode],
        pieces: list[tuple[int, int]],
        options: list[_Option],
        *,
        top: bool,
    ) -> CompositeUri:
        self.check_leaves("failover", components, pieces)
        # dialect= and vhost= on a failover are shorthands for nested.dialect= / nested.vhost=
        options = [_Option(f"nested.{o.key}", o.value, o.column) if o.key in _LEAF_SHORTHANDS else o
                   for o in options]
        nested = [o for o in options if o.key.startswith("nested.")]
        plain = [o for o in options if not o.key.startswith("nested.")]
        opts, amq_options = self.model(FailoverOptions, plain, "failover", "failover", jms=top)
        if nested:
            components = self.apply_nested(components, nested)
        if opts.priority_uris:
            opts = self.priority(opts, components, plain)
        return CompositeUri("failover", opts, tuple(components), amq=amq_options)

    def priority(
        self, opts: FailoverOptions, components: list[UriNode], plain: list[_Option]
    ) -> FailoverOptions:
        where = next(o.column for o in plain if o.key == "priorityURIs")
        known = {leaf.address for c in components for leaf in c.leaves()}
        addresses: list[str] = []
        for item in opts.priority_uris:
            try:
                node = _Parser(item).parse()
            except UriError as exc:
                raise self.error(f"priorityURIs: {exc}", where, option="priorityURIs") from None
            if not isinstance(node, LeafUri):
                raise self.error(f"priorityURIs: {_q(item)} is not a broker URI", where, option="priorityURIs")
            if node.address not in known and opts.update_uris_url is None:
                raise self.error(f"priorityURIs: {_q(item)} is not in the failover list", where, option="priorityURIs",
                    valid=sorted(known))
            addresses.append(node.address)
        return opts.model_copy(update={"priority_uris": tuple(addresses)})

    def apply_nested(self, components: list[UriNode], nested: list[_Option]) -> list[UriNode]:
        """``nested.X=v``: ``X=v`` on every broker URI that does not set X itself."""
        options = [_Option(o.key[len("nested."):], o.value, o.column) for o in nested]
        out: list[UriNode] = []
        for component in components:
            assert isinstance(component, LeafUri)  # check_leaves ran before
            leaf = component
            try:
                extra, extra_amq = self.model(LeafOptions, options, "broker URI (nested.)", None if leaf.scheme == "vm"
                                              else "transport", ssl=leaf.scheme == "ssl",
                                              valid=self.valid_leaf_names(leaf.scheme))
            except UriError as exc:
                raise UriError(str(exc).replace("option '", "option 'nested.", 1), uri=self.text, option=(
                    None if exc.option is None else f"nested.{exc.option}"), column=exc.column,
                    valid=[f"nested.{v}" for v in exc.valid]) from None
            data: dict[str, Any] = {f: getattr(extra, f) for f in extra.model_fields_set}
            data.update({f: getattr(leaf.options, f) for f in leaf.options.model_fields_set})
            own = {name for name, _ in leaf.amq}
            merged = leaf.amq + tuple((name, value) for name, value in extra_amq if name not in own)
            out.append(LeafUri(leaf.scheme, leaf.host, leaf.port, leaf.name, LeafOptions.model_validate(data),
                               merged))
        return out

    def check_leaves(self, scheme: str, components: list[UriNode], pieces: list[tuple[int, int]]) -> None:
        for component, (ps, _) in zip(components, pieces, strict=True):
            if not isinstance(component, LeafUri):
                raise self.error(f"{scheme}: lists broker URIs (tcp://, ssl://, vm://), not {component.scheme}:", ps,
                    valid=tuple(LEAF_SCHEMES))

    def check_static_components(self, components: list[UriNode], pieces: list[tuple[int, int]]) -> None:
        for component, (ps, _) in zip(components, pieces, strict=True):
            if isinstance(component, CompositeUri) and component.scheme != "failover":
                raise self.error("static: lists broker URIs or failover: URIs, not another static: "
                    "(masterslave: is a static: itself)", ps, valid=(*LEAF_SCHEMES, "failover"))

    # ------------------------------------------------------------------ leaves
    def leaf(self, raw_scheme: str, s: int, p: int, e: int, *, top: bool) -> LeafUri:
        text = self.text
        scheme = LEAF_SCHEMES[raw_scheme]
        q = text.find("?", s, e)
        head_end = q if q >= 0 else e
        hash_pos = text.find("#", s, e)
        if hash_pos >= 0:
            raise self.error("a '#fragment' is not allowed in a broker URI", hash_pos)
        for i in range(s, head_end):
            if text[i] in _WS:
                raise self.error("whitespace inside a broker URI", i)
        options = self.options(q + 1, e) if q >= 0 else []
        if not text.startswith("//", p):
            raise self.error(f"expected {raw_scheme}://{'NAME' if scheme == 'vm' else 'host:port'} after {raw_scheme}:",
                p)
        a = p + 2  # authority start
        if scheme == "vm":
            name = text[a:head_end].rstrip("/")
            if not name:
                raise self.error("vm:// needs a broker name: vm://NAME", a)
            if not _VM_NAME_RE.fullmatch(name):
                raise self.error(f"bad vm broker name {_q(name)}: use letters, digits, '_', '.', '-'", a)
            leaf_opts, _ = self.leaf_options("vm", options, top=False)
            return LeafUri("vm", "", 0, name, leaf_opts)
        slash = text.find("/", a, head_end)
        auth_end = slash if slash >= 0 else head_end
        if slash >= 0 and text[slash:head_end].strip("/"):
            raise self.error(f"unexpected path {_q(text[slash:head_end])} in a broker URI", slash)
        authority = text[a:auth_end]
        if "@" in authority:
            raise self.error("user info is not allowed in a broker URI; pass login=/passcode= to connect()",
                a + authority.index("@"))
        # split host / port ourselves for precise columns; yarl validates and normalises
        port_text: str | None = None
        port_pos = a
        if authority.startswith("["):
            rb = authority.find("]")
            if rb < 0:
                raise self.error("IPv6 host without a closing ']'", a)
            after = authority[rb + 1 :]
            if after:
                if not after.startswith(":"):
                    raise self.error(f"unexpected {_q(after)} after the IPv6 host", a + rb + 1)
                port_text = after[1:]
                port_pos = a + rb + 2
            host_text = authority[: rb + 1]
        else:
            host_text, colon, port_text_raw = authority.rpartition(":")
            if colon:
                port_text = port_text_raw
                port_pos = a + len(host_text) + 1
            else:
                host_text = authority
        if not host_text:
            raise self.error(f"missing host: expected {raw_scheme}://host:port", a)
        port = DEFAULT_PORTS[scheme]
        if port_text:
            if not _PORT_RE.fullmatch(port_text) or not 1 <= int(port_text) <= 65535:
                raise self.error(f"bad port {_q(port_text)}: expected a number from 1 to 65535", port_pos)
            port = int(port_text)
        try:
            url = yarl.URL(f"{scheme}://{host_text}")
            host = url.raw_host
        except (ValueError, TypeError, UnicodeError) as exc:
            raise self.error(f"bad host {_q(host_text)}: {exc}", a) from None
        if not host:
            raise self.error(f"missing host: expected {raw_scheme}://host:port", a)
        if ":" in host:
            address, pct, zone = host.partition("%")
            if zone.startswith("25"):
                zone = zone[2:]  # RFC 6874 writes the zone separator as %25
            try:
                address = ipaddress.IPv6Address(address).compressed
            except ValueError as exc:
                raise self.error(f"bad IPv6 host {_q(host_text)}: {exc}", a) from None
            if pct and not _ZONE_RE.fullmatch(zone):
                raise self.error(f"bad IPv6 zone {_q(zone)} in {_q(host_text)}", a)
            host = f"{address}%{zone}" if pct else address
        elif not _HOST_RE.fullmatch(host):
            raise self.error(f"bad host {_q(host_text)}: expected a host name, an IPv4 address or [IPv6]", a)
        leaf_opts, amq_options = self.leaf_options(scheme, options, top=top)
        return LeafUri(scheme, host, port, None, leaf_opts, amq_options)

    def leaf_options(self, scheme: str, options: list[_Option], *, top: bool) -> tuple[LeafOptions, Amq]:
        for o in options:
            if o.key.startswith("nested."):
                raise self.error(f"{_q(o.key)}: nested.* options belong on a failover: URI", o.column, option=o.key)
        # vm:// is our in-process broker: none of ActiveMQ's TCP options apply to it
        return self.model(LeafOptions, options, f"{scheme}://", None if scheme == "vm" else "transport",
                          ssl=scheme == "ssl", jms=top, valid=self.valid_leaf_names(scheme))

    @staticmethod
    def valid_leaf_names(scheme: str) -> tuple[str, ...]:
        names = [activemq_name(LeafOptions, f) for f in LeafOptions.model_fields]
        if scheme != "ssl":
            names = [n for n in names if n not in SSL_ONLY_OPTIONS]
        return tuple(names)

    # ------------------------------------------------------------------ options
    def split(self, s: int, e: int) -> list[tuple[int, int]]:
        """Split text[s:e] on commas at depth 0; trimmed (start, end) pieces."""
        text = self.text
        raw: list[tuple[int, int]] = []
        i = s
        start = s
        while i < e:
            ch = text[i]
            if ch == "(":
                i = self.match[i] + 1
                continue
            if ch == ",":
                raw.append((start, i))
                start = i + 1
            i += 1
        raw.append((start, e))
        pieces: list[tuple[int, int]] = []
        for ps, pe in raw:
            while ps < pe and text[ps] in _WS:
                ps += 1
            while pe > ps and text[pe - 1] in _WS:
                pe -= 1
            if ps == pe:
                raise self.error("empty element in a list of URIs (two commas, or a trailing comma)", ps)
            if pieces:
                prev_s, prev_e = pieces[-1]
                prev = text[prev_s:prev_e]
                if "?" in prev and _SCHEME_RE.match(text, ps, pe) is None:
                    pieces[-1] = (prev_s, pe)  # a comma inside an option value
                    continue
                last_option = re.split(r"[?&]", prev)[-1]
                if "?" in prev and last_option.startswith("priorityURIs="):
                    raise self.error("ambiguous comma after priorityURIs= inside a list of URIs: write the "
                        "commas between priority URIs as %2C (or give the failover its own "
                        "parentheses at top level)", ps - 1 if text[ps - 1] == "," else ps, option="priorityURIs")
            pieces.append((ps, pe))
        return pieces

    def options(self, s: int, e: int) -> list[_Option]:
        text = self.text
        out: list[_Option] = []
        seen: set[str] = set()
        pos = s
        for part in text[s:e].split("&"):
            here = pos
            pos += len(part) + 1
            if not part.strip():
                continue
            key_raw, eq, value_raw = part.partition("=")
            try:
                key = unquote_plus(key_raw, errors="strict").strip()
                value = unquote_plus(value_raw.strip(_WS), errors="strict")
            except UnicodeDecodeError:
                raise self.error(f"option {_q(part[:40])} is not valid %-encoded UTF-8", here) from None
            if not key:
                raise self.error("option without a name", here)
            if not eq:
                raise self.error(f"option {_q(key)} needs a value ({_q(key + '=...')})", here, option=key)
            if key in seen:
                raise self.error(f"option {_q(key)} given twice", here, option=key)
            seen.add(key)
            out.append(_Option(key, value, here))
        return out

    def model(
        self,
        model: type[FailoverOptions] | type[StaticOptions] | type[LeafOptions],
        options: list[_Option],
        kind: str,
        scope: amq.Scope | None,
        *,
        ssl: bool = False,
        jms: bool = False,
        valid: Sequence[str] | None = None,
    ) -> tuple[Any, Amq]:
        """Validate ``options``: ActiveMQ's names (activemq_options.py) and ours (the model's),
        both by ActiveMQ's first-letter rule; returns the model and the ActiveMQ options kept."""
        names = option_names(model)
        data: dict[str, Any] = {}
        by_field: dict[str, _Option] = {}
        kept: dict[str, _Option] = {}
        for o in options:
            entry = None
            if scope is not None:
                entry = amq.lookup("jms" if o.key.startswith("jms.") else scope, o.key)
            if entry is not None and o.key.startswith("jms.") and not jms:
                raise self.error(f"{_q(o.key)}: jms.* options belong on the outermost failover: or broker URI "
                                 "of a client URI (ActiveMQConnectionFactory reads them there)", o.column, option=o.key)
            if entry is not None and (entry.ssl_only and not ssl or entry.plain_only and ssl):
                which = "ssl://" if entry.ssl_only else "tcp:// (not ssl://)"
                raise self.error(f"option {_q(o.key)} applies to {which} broker URIs only", o.column,
                                 option=o.key, valid=valid or ())
            if entry is not None and (problem := amq.java_value_error(entry.java, o.value)):
                raise self.error(f"bad value for {kind} option {_q(o.key)} = {_q(o.value[:80])}: {problem}",
                                 o.column, option=o.key)
            if entry is not None and entry.field is None:
                if entry.name in kept:
                    raise self.error(f"option {_q(o.key)} and {_q(kept[entry.name].key)} are the same option, "
                                     "given twice", o.column, option=o.key)
                kept[entry.name] = o
                continue
            fname = entry.field if entry is not None else names.get(o.key)
            if fname is None:
                match = amq.bean_match(o.key, names)
                fname = None if match is None else names[match]
            if fname is None:
                raise self.unknown(o, names, kind, scope, valid=valid)
            if fname in by_field:
                raise self.error(f"option {_q(o.key)} and {_q(by_field[fname].key)} are the same option, given twice",
                    o.column, option=o.key)
            if ssl is False and activemq_name(model, fname) in SSL_ONLY_OPTIONS and model is LeafOptions:
                raise self.error(f"option {_q(o.key)} applies to ssl:// broker URIs only", o.column, option=o.key,
                                 valid=valid or ())
            by_field[fname] = o
            data[fname] = o.value
        try:
            return model.model_validate(data), tuple((name, o.value) for name, o in kept.items())
        except ValidationError as exc:
            raise self.validation(exc, options, kind, model) from None

    def unknown(
        self,
        o: _Option,
        names: dict[str, str],
        kind: str,
        scope: amq.Scope | None,
        *,
        valid: Sequence[str] | None = None,
    ) -> UriError:
        choices = list(valid) if valid is not None else list(names)
        theirs = [] if scope is None else [a.name for a in amq.TABLES[scope] if a.field is None]
        if o.key.startswith("jms.") and scope == "transport":
            theirs = [a.name for a in amq.JMS]
        close = difflib.get_close_matches(o.key, choices + theirs, n=1) or [
            c for c in choices + theirs if c.lower() == o.key.lower()][:1]
        hint = f" (did you mean {close[0]}?)" if close else ""
        if kind == "failover" and o.key in option_names(LeafOptions):
            hint += (
                " - a broker URI option; in failover:u1,u2?... the options after the last "
                "URI belong to the failover: use failover:(u1,u2?" + o.key + "=...)"
            )
        if theirs:
            hint += " - nor one of ActiveMQ 5.17's options (docs/uris.md)"
        return self.error(f"unknown {kind} option {_q(o.key)}{hint}", o.column, option=o.key, valid=choices)

    def validation(
        self,
        exc: ValidationError,
        options: list[_Option],
        kind: str,
        model: type[BaseModel],
        *,
        prefix: str = "",
    ) -> UriError:
        names = option_names(model)
        first = exc.errors()[0]
        loc = str(first["loc"][0]) if first.get("loc") else ""
        fname = names.get(loc, loc)
        culprit = next(
            (o for o in options if names.get(o.key[len(prefix) :] if prefix else o.key) == fname),
            None,
        )
        msg = str(first.get("msg", "invalid value"))
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        if culprit is None:
            return self.error(f"bad {kind} options: {msg}")
        return self.error(f"bad value for {kind} option {_q(culprit.key)} = {_q(culprit.value[:80])}: {msg}",
            culprit.column, option=culprit.key)
