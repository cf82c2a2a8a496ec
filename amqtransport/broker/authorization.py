"""Destination authorization, as ActiveMQ's ``authorizationPlugin`` does it.

Theory of operation
-------------------
With a users file the broker knows *who* connected; with ``[[authorization]]`` entries
in its config it also decides *what* each user may do, per destination pattern:

``read``
    subscribe (durable or not) and browse;
``write``
    send;
``admin``
    create a destination that does not exist yet, which is what a first send or a
    first subscription does (ActiveMQ checks it the same way: a user with ``write``
    but not ``admin`` may send only to a queue that someone allowed to create it has
    already used).

Each entry names a pattern (``queue = "orders.>"`` or ``topic = ">"``, wildcards as
everywhere else: ``*`` one segment, ``>`` the rest) and, for each operation, the
**groups** allowed (a list, or ActiveMQ's comma-separated string). Groups come from
the ``[groups]`` table (``admins = ["alice"]``) and/or ``groups_file``, a file in
ActiveMQ's ``groups.properties`` format (``admins=alice,bob``). As in ActiveMQ's
``DefaultAuthorizationMap``, every entry whose pattern matches the destination
contributes its groups (their union), and a destination no entry matches is refused to
everyone. A wildcard subscription's name is matched as written (``orders.>`` by the
entries ``orders.>`` and ``>``): it needs read on an entry covering all it may match.
Temporary destinations and the advisory topics are not checked (ActiveMQ has separate
entries for them; ours are scoped to their connection and read-only).

Without entries nothing is checked (every authenticated user may do everything, as
before). Entries need a users file: without logins there is nobody to authorize, and
the config is refused with that reason.

A refusal is the text of the ERROR frame, ActiveMQ's words: ``User alice is not
authorized to write to: queue://orders``. The decisions are pure; only
:func:`load_groups` reads a file, once, at configuration time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from amqtransport.destinations import (
    ADVISORY_PREFIX,
    Pattern,
    match,
    parse_destination,
    parse_pattern,
    wildcard_segments,
)
from amqtransport.errors import ConfigError, DestinationError

__all__ = ["ADMIN", "READ", "WRITE", "AuthorizationEntry", "Authorizer", "load_groups", "parse_entries"]

READ, WRITE, ADMIN = "read", "write", "admin"
_VERBS = {READ: "read from", WRITE: "write to", ADMIN: "create"}


@dataclass(frozen=True)
class AuthorizationEntry:
    """One ``[[authorization]]`` entry: a pattern and the groups of each operation."""

    pattern: Pattern
    read: frozenset[str]
    write: frozenset[str]
    admin: frozenset[str]

    def groups(self, operation: str) -> frozenset[str]:
        return {READ: self.read, WRITE: self.write, ADMIN: self.admin}[operation]


def _group_list(value: object, where: str) -> frozenset[str]:
    if isinstance(value, str):
        items: Iterable[object] = value.split(",")
    elif isinstance(value, Sequence):
        items = value
    else:
        raise ConfigError(f"{where}: expected a list of group names or a comma-separated string, got {value!r}",
                          path=where)
    out = []
    for item in items:
        if not isinstance(item, str):
            raise ConfigError(f"{where}: group names are strings, got {item!r}", path=where)
        if item.strip():
            out.append(item.strip())
    return frozenset(out)


def parse_entries(raw: Sequence[Mapping[str, object]]) -> tuple[AuthorizationEntry, ...]:
    """The ``[[authorization]]`` tables of a config, checked: each names exactly one of
    ``queue``/``topic`` and only ``read``/``write``/``admin`` besides. ConfigError
    naming the entry (``authorization[2]``) and what is wrong otherwise."""
    out: list[AuthorizationEntry] = []
    for i, entry in enumerate(raw):
        where = f"authorization[{i}]"
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{where}: expected a table, got {entry!r}", path=where)
        unknown = set(entry) - {"queue", "topic", READ, WRITE, ADMIN}
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))} (expected queue or topic, "
                              "and read, write, admin)", path=where)
        kinds = [k for k in ("queue", "topic") if k in entry]
        if len(kinds) != 1:
            raise ConfigError(f"{where}: name exactly one of queue = \"PATTERN\" or topic = \"PATTERN\"", path=where)
        kind = kinds[0]
        text = entry[kind]
        if not isinstance(text, str):
            raise ConfigError(f"{where}: {kind} must be a pattern string, got {text!r}", path=where)
        try:
            pattern = parse_pattern(f"/{kind}/{text}")
        except DestinationError as exc:
            raise ConfigError(f"{where}: {exc}", path=where) from None
        out.append(AuthorizationEntry(pattern, *(_group_list(entry.get(op, ()), f"{where}.{op}")
                                                 for op in (READ, WRITE, ADMIN))))
    return tuple(out)


def load_groups(path: str | Path | None, table: Mapping[str, Sequence[str]]) -> dict[str, frozenset[str]]:
    """user -> groups, from a ``groups.properties`` file (``group=user1,user2``; ``#``
    comments) and the config's ``[groups]`` table (group -> users), merged."""
    members: dict[str, set[str]] = {g: {u.strip() for u in users if u.strip()} for g, users in table.items()}
    if path is not None:
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{p}: cannot read groups file: {exc.strerror or exc}", path="groups_file") from None
        for n, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith(("#", "!")):
                continue
            group, sep, names = line.partition("=")
            if not sep or not group.strip():
                raise ConfigError(f"{p}:{n}: expected 'group=user1,user2', got {line[:40]!r}", path=f"line {n}")
            members.setdefault(group.strip(), set()).update(u.strip() for u in names.split(",") if u.strip())
    of_user: dict[str, set[str]] = {}
    for group, users in members.items():
        for user in users:
            of_user.setdefault(user, set()).add(group)
    return {u: frozenset(gs) for u, gs in of_user.items()}


class Authorizer:
    """The broker's decisions: :meth:`check` a user's operation on a destination."""

    def __init__(self, entries: Sequence[AuthorizationEntry], groups: Mapping[str, frozenset[str]]) -> None:
        self.entries = tuple(entries)
        self._groups = dict(groups)

    @property
    def active(self) -> bool:
        return bool(self.entries)

    def allowed_groups(self, operation: str, kind: str, name: str) -> frozenset[str]:
        """The union of the groups every entry matching ``kind``/``name`` allows
        ``operation`` for. A wildcard name is matched as it is written (``orders.>`` is
        matched by the entries ``orders.>`` and ``>``, not by ``orders.eu``), so a
        wildcard subscription needs read on an entry that covers all it may match."""
        segments = tuple(name.split("."))
        out: set[str] = set()
        for e in self.entries:
            if e.pattern.kind == kind and match(e.pattern.segments, segments):
                out |= e.groups(operation)
        return frozenset(out)

    def check(self, user: str | None, operation: str, kind: str, name: str) -> str | None:
        """None when ``user`` may ``operation`` (read, write, admin) the destination
        ``kind``/``name``, else ActiveMQ's refusal text."""
        if not self.entries or name.startswith(ADVISORY_PREFIX):
            return None
        if self._groups.get(user or "", frozenset()) & self.allowed_groups(operation, kind, name):
            return None
        return f"User {user or 'anonymous'} is not authorized to {_VERBS[operation]}: {kind}://{name}"

    def refusal(self, user: str | None, operation: str, destination: str,
                known: Callable[[str, str], bool]) -> str | None:
        """None when ``user`` may ``operation`` (read, write) the STOMP ``destination`` a
        connection names and, when the broker does not have it yet (``known(kind, name)``
        is False), create it (admin); else ActiveMQ's refusal text. A composite send needs
        every part (the first refused part is the answer). Not checked here: a name that
        is no destination at all (the core refuses it in its own words) and a temporary
        destination (scoped to its connection)."""
        if "," in destination and operation == WRITE:  # a composite: every part
            for part in destination.split(","):
                refused = self.refusal(user, operation, part, known)
                if refused is not None:
                    return refused
            return None
        try:
            dest = parse_destination(destination)
        except DestinationError:
            return None
        if dest.temporary:
            return None
        refused = self.check(user, operation, dest.kind, dest.name)
        if refused is None and wildcard_segments(dest.name) is None and not known(dest.kind, dest.name):
            refused = self.check(user, ADMIN, dest.kind, dest.name)
        return refused
