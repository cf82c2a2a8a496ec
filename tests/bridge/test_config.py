"""The bridge's TOML config: good files load, bad ones say where (bridge/config.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amqtransport.errors import ConfigError
from bridge.config import BridgeConfig, leaf_addresses, load_config, parse_config

GOOD = """
local_uri = "failover:(tcp://127.0.0.1:61613,tcp://127.0.0.1:61623)?randomize=false"
status_listen = "127.0.0.1:8162"

[[network_connector]]
name = "spoke1-to-hub"
uri = "masterslave:(tcp://127.0.0.1:61633,tcp://127.0.0.1:61643)"
static_include = ["/queue/orders"]
dynamic_include = ["/queue/events.>"]
exclude = ["/queue/local.>"]
duplex = false
network_ttl = 1
login = "bridge"
passcode = "secret"
"""


def test_good_config_loads(tmp_path: Path) -> None:
    f = tmp_path / "bridge.toml"
    f.write_text(GOOD)
    cfg = load_config(f)
    assert isinstance(cfg, BridgeConfig)
    nc = cfg.network_connector[0]
    assert nc.name == "spoke1-to-hub"
    assert nc.static_include == ["/queue/orders"]
    assert nc.network_ttl == 1 and nc.duplex is False
    assert nc.prefetch == 1000 and nc.advisories == "auto"
    assert cfg.status_address == ("127.0.0.1", 8162)


def _with(replace: str, by: str) -> str:
    assert replace in GOOD
    return GOOD.replace(replace, by)


@pytest.mark.parametrize(
    ("text", "path", "fragment"),
    [
        (_with("network_ttl = 1", "network_ttl = 0"), "network_connector[0].network_ttl", "must be >= 1"),
        (_with("network_ttl = 1", 'network_ttl = "1"'), "network_connector[0].network_ttl", "must be an integer"),
        (_with("duplex = false", "duplex = 1"), "network_connector[0].duplex", "must be true or false"),
        (_with("duplex = false", "duplx = false"), "network_connector[0].duplx", "unknown key"),
        (_with('status_listen = "127.0.0.1:8162"', 'status_listen = "nowhere"'), "status_listen", "HOST:PORT"),
        (_with('status_listen = "127.0.0.1:8162"', 'status_listen = "h:99999"'), "status_listen", "HOST:PORT"),
        (_with('name = "spoke1-to-hub"\n', ""), "network_connector[0].name", "required key is missing"),
        (_with('exclude = ["/queue/local.>"]', 'exclude = ["/queue/ok", "local.>"]'), "network_connector[0].exclude[1]", "must start with /queue/"),
        (_with('static_include = ["/queue/orders"]', 'static_include = ["/queue/a.>.b"]'), "network_connector[0].static_include[0]", "last segment"),
        (_with('static_include = ["/queue/orders"]', 'static_include = ["/queue/local.x"]'), "network_connector[0].static_include[0]", "excluded by exclude[0]"),
        (_with('static_include = ["/queue/orders"]', 'static_include = ["/queue/>"]'), "network_connector[0].static_include[0]", "overlaps exclude[0]"),
        (_with('passcode = "secret"\n', ""), "network_connector[0].passcode", "go together"),
        (_with('local_uri = "failover', 'locl_uri = "failover'), "locl_uri", "unknown key"),
        (_with('local_uri = "failover', '# local_uri = "failover'), "network_connector[0].local_uri", "no local broker"),
        ('local_uri = "tcp://127.0.0.1:61613"\n', "network_connector", "required key is missing"),
        ('local_uri = "tcp://127.0.0.1:61613"\nnetwork_connector = []\n', "network_connector", "at least 1"),
        (GOOD + GOOD.split("\n\n", 1)[1].replace("local_uri", "#").replace("status_listen", "#"), "network_connector[1].name", "duplicate name"),
        (_with("network_ttl = 1", "network_ttl = 1\nprefetch = 0"), "network_connector[0].prefetch", "must be >= 1"),
        (_with('static_include = ["/queue/orders"]\ndynamic_include = ["/queue/events.>"]', ""), "network_connector[0]", "nothing to forward"),
        (_with("network_ttl = 1", 'advisories = "maybe"'), "network_connector[0].advisories", "must be one of"),
        (_with('name = "spoke1-to-hub"', 'name = "two words"'), "network_connector[0].name", "letters, digits"),
        (_with("tcp://127.0.0.1:61633,", "tcp://127.0.0.1:61623,"), "network_connector[0].uri", "points at the local broker"),
    ],
)
def test_errors_name_their_path(text: str, path: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    err = info.value
    line = next((ln for ln in str(err).splitlines() if ln.startswith(path + ":")), None)
    assert line is not None, str(err)
    assert fragment in line, str(err)


HUB = """
status_listen = ""

[[network_connector]]
name = "spoke1"
local_uri = "tcp://127.0.0.1:61001"
broker_name = "spoke-one"
uri = "masterslave:(tcp://127.0.0.1:61633,tcp://127.0.0.1:61643)"
static_include = ["/queue/orders"]

[[network_connector]]
name = "spoke2"
local_uri = "tcp://127.0.0.1:61002"
uri = "masterslave:(tcp://127.0.0.1:61633,tcp://127.0.0.1:61643)"
static_include = ["/queue/orders"]
"""


def test_each_connector_may_have_its_own_local_broker() -> None:
    """One agent, many spokes into one hub: each connector names its own local broker
    (and identity in the hop path); the file's local_uri is then not needed."""
    from bridge.agent import BridgeAgent

    cfg = parse_config(HUB)
    assert cfg.local_uri is None
    agent = BridgeAgent(cfg)
    one, two = agent.connectors
    assert (one.local_uri, one.here.label) == ("tcp://127.0.0.1:61001", "spoke-one")
    assert (two.local_uri, two.here.label) == ("tcp://127.0.0.1:61002", "tcp://127.0.0.1:61002")
    mixed = parse_config('local_uri = "tcp://127.0.0.1:61000"\nbroker_name = "hq"\n' + HUB.replace(
        'local_uri = "tcp://127.0.0.1:61002"\n', ""))
    one, two = BridgeAgent(mixed).connectors
    assert (one.local_uri, one.here.label) == ("tcp://127.0.0.1:61001", "spoke-one")
    assert (two.local_uri, two.here.label) == ("tcp://127.0.0.1:61000", "hq")  # the file's broker
    with pytest.raises(ConfigError, match="network_connector.1..uri: points at the local broker"):
        parse_config(HUB.replace("tcp://127.0.0.1:61002", "tcp://127.0.0.1:61643"))


def test_bad_uri_is_a_config_error_naming_the_key() -> None:
    pytest.importorskip("amqtransport.uri", reason="the URI parser is built by another part")
    with pytest.raises(ConfigError) as info:
        parse_config(_with("masterslave:(tcp://127.0.0.1:61633,", "masterslave:(tcp://127.0.0.1:61633,,"))
    assert str(info.value).startswith("network_connector[0].uri: bad URI")


def test_not_toml(tmp_path: Path) -> None:
    f = tmp_path / "x.toml"
    f.write_text("local_uri = \n")
    with pytest.raises(ConfigError) as info:
        load_config(f)
    assert "not valid TOML" in str(info.value) and str(f) in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.toml")


def test_multiple_errors_all_reported() -> None:
    text = _with("network_ttl = 1", "network_ttl = 0\nprefetch = -3")
    with pytest.raises(ConfigError) as info:
        parse_config(text, source="b.toml")
    msg = str(info.value)
    assert "network_connector[0].network_ttl: must be >= 1" in msg
    assert "network_connector[0].prefetch: must be >= 1" in msg
    assert info.value.path == "network_connector[0].network_ttl"


def test_status_listen_can_be_disabled() -> None:
    cfg = parse_config(_with('status_listen = "127.0.0.1:8162"', 'status_listen = ""'))
    assert cfg.status_address is None


def test_leaf_addresses_identify_a_pair_whatever_the_wrapper() -> None:
    a = leaf_addresses("failover:(tcp://127.0.0.1:61613,tcp://127.0.0.1:61623)?randomize=false")
    b = leaf_addresses("masterslave:(tcp://127.0.0.1:61623,tcp://127.0.0.1:61613)")
    assert a == b == ("tcp://127.0.0.1:61613", "tcp://127.0.0.1:61623")


# ---------------------------------------------------------------- fuzz

KEYS = ["local_uri", "status_listen", "broker_name", "network_connector", "name", "uri", "static_include",
        "dynamic_include", "exclude", "duplex", "network_ttl", "login", "passcode", "local_login",
        "local_passcode", "prefetch", "heartbeat_ms", "advisories", "loop_pause_ms", "remote_name", "bogus"]


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v) if v == v and v not in (float("inf"), float("-inf")) else "nan"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


scalars = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
    st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=30),
    st.sampled_from(["/queue/a.>", "/topic/*", "tcp://127.0.0.1:1", "masterslave:(tcp://a:1,tcp://b:2)", "auto", "127.0.0.1:0"]),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(KEYS), inner, max_size=4)), max_leaves=8)
docs = st.dictionaries(st.sampled_from(KEYS), values, max_size=6)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(docs, st.lists(st.dictionaries(st.sampled_from(KEYS), values, max_size=6), max_size=2))
def test_fuzz_structured_docs_raise_only_config_error(doc: dict[str, Any], connectors: list[dict[str, Any]]) -> None:
    text = "\n".join(f"{k} = {_toml_value(v)}" for k, v in doc.items() if k != "network_connector")
    for c in connectors:
        text += "\n[[network_connector]]\n" + "\n".join(f"{k} = {_toml_value(v)}" for k, v in c.items())
    try:
        parse_config(text)
    except ConfigError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_fuzz_random_text_raises_only_config_error(text: str) -> None:
    try:
        parse_config(text)
    except ConfigError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([GOOD, "[[network_connector]]\n", "name = 3\n", 'uri = "static:("\n',
                                 "network_ttl = 99999\n", 'exclude = ["/queue/>"]\n', "duplex = true\n",
                                 "[x]\n", "prefetch = 1.5\n"]), max_size=5))
def test_fuzz_spliced_docs_raise_only_config_error(parts: list[str]) -> None:
    try:
        parse_config("".join(parts))
    except ConfigError:
        pass
