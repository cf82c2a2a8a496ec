"""Broker config file, users file and password hashing (pure; hypothesis-fuzzed parsers)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amqtransport.broker.config import (
    BrokerConfig,
    config_from_mapping,
    hash_password,
    load_config,
    load_users,
    verify_password,
)
from amqtransport.errors import ConfigError


def test_config_file_top_level_and_table(tmp_path: Path) -> None:
    a = tmp_path / "a.toml"
    a.write_text('port = 1234\nmax_redeliveries = 2\nname = "n1"\n')
    b = tmp_path / "b.toml"
    b.write_text("[broker]\nport = 1234\nfsync = false\n")
    assert load_config(a).port == 1234 and load_config(a).max_redeliveries == 2
    assert load_config(b).fsync is False


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("prot = 1\n", "prot"),
        ("port = -5\n", "port"),
        ("max_frame_size = 'big'\n", "max_frame_size"),
        ("[broker]\nbogus = 1\n", "bogus"),
        ("[broker]\nport = 1\n[other]\nx = 1\n", "other"),
        ("port = \n", "TOML"),
    ],
)
def test_bad_config_names_the_key(tmp_path: Path, text: str, named: str) -> None:
    p = tmp_path / "c.toml"
    p.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(p)
    assert named in str(info.value)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.toml")


def test_users_file(tmp_path: Path) -> None:
    p = tmp_path / "users"
    p.write_text(f"# comment\n\nalice:secret\nbob:{hash_password('pw', salt='s1')}\ncarol:with:colon\n")
    users = load_users(p)
    assert users["alice"] == "secret"
    assert verify_password(users["bob"], "pw") and not verify_password(users["bob"], "PW")
    assert verify_password(users["carol"], "with:colon")
    assert not verify_password(users["alice"], "secret ")


@pytest.mark.parametrize("text", ["", "# only a comment\n", "nocolon\n", ":nouser\n", "x:sha256$abc\n"])
def test_bad_users_file(tmp_path: Path, text: str) -> None:
    p = tmp_path / "users"
    p.write_text(text)
    with pytest.raises(ConfigError):
        load_users(p)


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(st.text(max_size=200))
def test_users_parser_never_raises_anything_else(tmp_path: Path, text: str) -> None:
    p = tmp_path / "fuzz-users"
    p.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        users = load_users(p)
    except ConfigError:
        return
    assert users and all(users)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from([*BrokerConfig.model_fields, "junk"]), st.one_of(st.integers(), st.text(max_size=5), st.booleans(), st.floats())))
def test_config_validation_never_raises_anything_else(data: dict[str, object]) -> None:
    try:
        cfg = config_from_mapping(data)
    except ConfigError as exc:
        assert str(exc)
        return
    assert isinstance(cfg, BrokerConfig)


@given(st.text(max_size=30), st.text(max_size=30))
def test_hash_and_verify(password: str, other: str) -> None:
    stored = hash_password(password)
    assert verify_password(stored, password)
    assert verify_password(stored, other) == (other == password)
