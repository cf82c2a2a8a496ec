"""Which brokers a failover transport tries: its own list, ``updateURIsURL``, and the
priority endpoints of ``priorityBackup``.

Functions over leaves (parsed broker URIs); the failover transport calls them before
each reconnect and while it probes for a priority endpoint.
"""

from __future__ import annotations

import logging
import random
import urllib.request
from collections.abc import Callable, Iterator, Sequence

from amqtransport._backends.base import leaf_address
from amqtransport.backoff import Attempt
from amqtransport.options import FailoverOptions
from amqtransport.uri import LeafUri, UriNode, parse_uri

__all__ = ["endpoints", "is_priority", "priority_attempts", "priority_leaves", "read_update_uris"]

log = logging.getLogger("amqtransport.transports.failover")

#: parses one URI of the list (``parse_uri`` unless a test injects another)
UriParser = Callable[[str], UriNode]


def read_update_uris(url: str, parser: UriParser | None = None) -> list[LeafUri]:
    """``updateURIsURL``: a file path, ``file://`` or ``http(s)://`` URL holding a
    comma-separated list of leaf URIs, read before each reconnect. What cannot be
    read or parsed is logged and left out."""
    try:
        if url.startswith(("http://", "https://", "file://")):
            with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - user-configured URL
                text = resp.read().decode("utf-8")
        else:
            with open(url, encoding="utf-8") as fh:
                text = fh.read()
    except (OSError, ValueError) as exc:
        log.warning("updateURIsURL %s: cannot read: %s", url, exc)
        return []
    if parser is None:
        parser = parse_uri
    out: list[LeafUri] = []
    for part in text.replace("\n", ",").split(","):
        part = part.strip()
        if not part:
            continue
        try:
            node = parser(part)
        except ValueError as exc:
            log.warning("updateURIsURL %s: ignoring %r: %s", url, part, exc)
            continue
        if not isinstance(node, LeafUri):
            log.warning("updateURIsURL %s: ignoring composite %r", url, part)
            continue
        out.append(node)
    return out


def endpoints(leaves: Sequence[LeafUri], update_uris_url: str | None, parser: UriParser | None = None) -> list[LeafUri]:
    """The leaves to try: the URI's, then those of ``updateURIsURL`` not already listed."""
    out = list(leaves)
    if update_uris_url:
        for leaf in read_update_uris(update_uris_url, parser):
            if all(leaf_address(leaf) != leaf_address(x) for x in out):
                out.append(leaf)
    return out


def priority_leaves(leaves: Sequence[LeafUri], priority_uris: Sequence[str]) -> list[LeafUri]:
    """``priorityBackup``'s endpoints: those of ``leaves`` named by ``priorityURIs``,
    else (or when none matches) the first leaf."""
    if not priority_uris:
        return [leaves[0]]
    wanted = set()
    for text in priority_uris:
        addr = text.split("?", 1)[0].rstrip("/")
        addr = addr.replace("stomp+ssl://", "ssl://").replace("stomp://", "tcp://")
        wanted.add(addr)
    found = [leaf for leaf in leaves if leaf_address(leaf) in wanted]
    return found or [leaves[0]]


def is_priority(address: str, leaves: Sequence[LeafUri], options: FailoverOptions) -> bool:
    """Is ``address`` one of ``priorityBackup``'s endpoints?"""
    return address in {leaf_address(x) for x in priority_leaves(leaves, tuple(options.priority_uris))}


def priority_attempts(leaves: Sequence[LeafUri], options: FailoverOptions,
                      schedule: Callable[..., Iterator[Attempt[LeafUri]]],
                      rng: random.Random | None) -> Iterator[Attempt[LeafUri]]:
    """The priority probe's attempts: the priority endpoints in order, on the failover
    back-off, without end (it stops when the transport is back on one, or moves)."""
    opts = options.model_copy(update={"max_reconnect_attempts": -1, "startup_max_reconnect_attempts": -1,
                                      "randomize": False})
    return schedule(priority_leaves(leaves, tuple(options.priority_uris)), opts, startup=False, rng=rng)
