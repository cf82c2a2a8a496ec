"""Hypothesis strategies: random URI trees (canonical by construction)."""

from __future__ import annotations

import ipaddress
from typing import Any

from hypothesis import strategies as st

from amqtransport import activemq_options as amq
from amqtransport.options import FailoverOptions, LeafOptions, StaticOptions
from amqtransport.uri import CompositeUri, LeafUri, UriNode

LABEL = st.from_regex(r"[a-z0-9_][a-z0-9_\-]{0,8}", fullmatch=True)
HOSTNAME = st.lists(LABEL, min_size=1, max_size=3).map(".".join)
IPV4 = st.ip_addresses(v=4).map(str)
IPV6 = st.ip_addresses(v=6).map(lambda ip: ipaddress.IPv6Address(ip).compressed)
HOST = st.one_of(HOSTNAME, IPV4, IPV6)
PORT = st.integers(1, 65535)
# option text: anything printable or not, but no control characters (rejected by the model)
TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=12
)
MS = st.integers(0, 10**9)


@st.composite
def leaf_options(draw: st.DrawFn, scheme: str) -> LeafOptions:
    data: dict[str, Any] = {}
    if draw(st.booleans()):
        data["connect_timeout"] = draw(MS)
    if draw(st.booleans()):
        data["heart_beat"] = f"{draw(st.integers(0, 10**6))},{draw(st.integers(0, 10**6))}"
    if draw(st.booleans()):
        data["host"] = draw(TEXT)
    if draw(st.booleans()):
        data["dialect"] = draw(st.sampled_from(["amq", "activemq", "artemis", "rabbitmq"]))
    if draw(st.booleans()):
        data["text_mode"] = draw(st.booleans())
    if draw(st.booleans()):
        data["duplicate_id_header"] = draw(TEXT.filter(lambda t: not any(c in t for c in ":\r\n\x00")))
    if scheme == "ssl":
        for name in ("ca_file", "cert_file", "key_file", "server_hostname"):
            if draw(st.booleans()):
                data[name] = draw(TEXT)
        if draw(st.booleans()):
            data["verify"] = draw(st.booleans())
    return LeafOptions.model_validate(data)


def java_value(java: str) -> st.SearchStrategy[str]:
    """A value ActiveMQ (and so we) accept for an option of Java type ``java``."""
    return {
        "boolean": st.sampled_from(["true", "false", "TRUE"]), "Boolean": st.sampled_from(["true", "false"]),
        "int": st.integers(-(2**31), 2**31 - 1).map(str), "long": st.integers(0, 2**40).map(str),
        "short": st.integers(0, 100).map(str), "double": st.sampled_from(["1.5", "2", "0.25"]),
        "tos": st.integers(0, 255).map(str), "dscp": st.sampled_from(["EF", "AF11", "CS7", "10"]),
        "openwire": st.integers(1, 12).map(str), "protocols": st.sampled_from(["TLSv1.2", "TLSv1.2,TLSv1.3"]),
        "ciphers": st.sampled_from(["TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384,TLS_AES_128_GCM_SHA256"]),
        "uri": st.sampled_from(["tcp://localhost:61616", "failover:(tcp://a:1)"]),
    }.get(java, TEXT)


@st.composite
def amq_options(draw: st.DrawFn, table: tuple[amq.AmqOption, ...], *, ssl: bool) -> tuple[tuple[str, str], ...]:
    """ActiveMQ-only options (no field of ours) as the parser keeps them: canonical names."""
    usable = [o for o in table if o.field is None and (ssl or not o.ssl_only) and not (ssl and o.plain_only)
              and o.name != "useInactivityMonitor"]
    chosen = draw(st.lists(st.sampled_from(usable), max_size=3, unique_by=lambda o: o.name)) if usable else []
    kept = {o.name: draw(java_value(o.java)) for o in chosen}
    while clash := amq.conflict(kept):  # options ActiveMQ refuses together (e.g. writeTimeout without soWriteTimeout)
        del kept[clash[0]]
    return tuple(kept.items())


@st.composite
def leaves(draw: st.DrawFn) -> LeafUri:
    scheme = draw(st.sampled_from(["tcp", "ssl", "vm"]))
    options = draw(leaf_options(scheme))
    if scheme == "vm":
        name = draw(st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,10}", fullmatch=True))
        return LeafUri("vm", "", 0, name, options)
    kept = draw(amq_options(amq.TRANSPORT, ssl=scheme == "ssl"))
    return LeafUri(scheme, draw(HOST), draw(PORT), None, options, kept)


@st.composite
def failover_options(draw: st.DrawFn, addresses: list[str]) -> FailoverOptions:
    data: dict[str, Any] = {}
    optional = {
        "initial_reconnect_delay": MS,
        "max_reconnect_delay": MS,
        "use_exponential_backoff": st.booleans(),
        "reconnect_delay_exponent": st.floats(1.0, 1e6, allow_nan=False, allow_infinity=False),
        "max_reconnect_attempts": st.integers(-1, 10**6),
        "startup_max_reconnect_attempts": st.integers(-1, 10**6),
        "randomize": st.booleans(),
        "timeout": st.integers(-1, 10**9),
        "priority_backup": st.booleans(),
        "backup": st.booleans(),
        "backup_pool_size": st.integers(0, 100),
        "track_messages": st.booleans(),
        "max_cache_size": MS,
        "warn_after_reconnect_attempts": st.integers(0, 1000),
        "update_uris_url": TEXT,
        "reconnect_jitter": st.floats(0.0, 1.0, allow_nan=False),
    }
    for name, strategy in optional.items():
        if draw(st.booleans()):
            data[name] = draw(strategy)
    if draw(st.booleans()):
        data["priority_uris"] = tuple(draw(st.lists(st.sampled_from(addresses), min_size=1, max_size=3, unique=True)))
    return FailoverOptions.model_validate(data)


@st.composite
def static_options(draw: st.DrawFn) -> StaticOptions:
    data: dict[str, Any] = {}
    optional = {
        "initial_reconnect_delay": MS,
        "max_reconnect_delay": MS,
        "use_exponential_backoff": st.booleans(),
        "backoff_multiplier": st.integers(1, 1000),
        "max_reconnect_attempts": st.integers(0, 10**6),
        "min_connect_time": MS,
    }
    for name, strategy in optional.items():
        if draw(st.booleans()):
            data[name] = draw(strategy)
    return StaticOptions.model_validate(data)


@st.composite
def failovers(draw: st.DrawFn) -> CompositeUri:
    components = draw(st.lists(leaves(), min_size=1, max_size=4))
    options = draw(failover_options([c.address for c in components]))
    return CompositeUri("failover", options, tuple(components), amq=draw(amq_options(amq.FAILOVER, ssl=False)))


@st.composite
def statics(draw: st.DrawFn) -> CompositeUri:
    components = draw(st.lists(st.one_of(leaves(), failovers()), min_size=1, max_size=3))
    return CompositeUri("static", draw(static_options()), tuple(components))


def trees() -> st.SearchStrategy[UriNode]:
    return st.one_of(leaves(), failovers(), statics())
