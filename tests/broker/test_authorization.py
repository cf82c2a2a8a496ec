"""Destination authorization (ActiveMQ's authorizationPlugin) and client-id uniqueness.

The rules alone (pure), then a real ``amq broker run`` with a users file, a groups file
in ActiveMQ's format and ``[[authorization]]`` entries, driven by the client as users
would: who may send, create, read; what the ERROR says; a client-id connected twice."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import amqtransport
from amqtransport.broker.authorization import (
    ADMIN,
    READ,
    WRITE,
    Authorizer,
    load_groups,
    parse_entries,
)
from amqtransport.broker.config import BrokerConfig, config_from_mapping
from amqtransport.errors import BrokerError, ConfigError
from amqtransport.testing.broker_process import BrokerProcess

pytestmark = pytest.mark.timeout(120)

ENTRIES = [
    {"queue": ">", "read": "admins", "write": "admins", "admin": "admins"},
    {"queue": "orders.>", "read": ["users", "readers"], "write": "users", "admin": "users"},
    {"queue": "audit", "write": "writers"},
    {"topic": "prices.*", "read": "readers", "write": "users", "admin": "users,readers"},
]
GROUPS = {"alice": frozenset({"users"}), "bob": frozenset({"readers"}), "root": frozenset({"admins"}),
          "wendy": frozenset({"writers"})}


def test_the_rules() -> None:
    a = Authorizer(parse_entries(ENTRIES), GROUPS)
    assert a.check("alice", WRITE, "queue", "orders.eu") is None
    assert a.check("bob", WRITE, "queue", "orders.eu") == "User bob is not authorized to write to: queue://orders.eu"
    assert a.check("bob", READ, "queue", "orders.eu") is None
    assert a.check("root", READ, "queue", "orders.eu") is None, "the '>' entry adds its groups (union)"
    assert a.check("alice", READ, "queue", "payments") == "User alice is not authorized to read from: queue://payments"
    assert a.check("wendy", WRITE, "queue", "audit") is None
    assert a.check("wendy", ADMIN, "queue", "audit") == "User wendy is not authorized to create: queue://audit"
    assert a.check(None, READ, "queue", "orders.eu") == "User anonymous is not authorized to read from: queue://orders.eu"
    # a wildcard is matched as written: orders.> is covered by 'orders.>' (and '>'), '>' only by '>'
    assert a.check("bob", READ, "queue", "orders.>") is None
    assert a.check("bob", READ, "queue", ">") is not None
    assert a.check("bob", READ, "queue", "*.eu") is not None
    assert a.check("bob", READ, "topic", "prices.eur") is None and a.check("bob", WRITE, "topic", "prices.eur")
    assert a.check("bob", READ, "topic", "ActiveMQ.Advisory.Consumer.Queue.x") is None  # advisories: not checked
    assert Authorizer((), {}).check("anyone", ADMIN, "queue", "x") is None  # no entries: nothing checked


@pytest.mark.parametrize("entry, message", [
    ({"read": "a"}, "name exactly one of queue"),
    ({"queue": "a", "topic": "b"}, "name exactly one of queue"),
    ({"queue": "a.>.b"}, "'>' may only be the last segment"),
    ({"queue": "a", "reed": "x"}, "unknown key(s) reed"),
    ({"queue": "a", "read": 3}, "expected a list of group names"),
])
def test_bad_entries_are_named(entry: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=r"authorization\[1\]") as info:
        parse_entries([{"queue": ">"}, entry])
    assert message in str(info.value)
    with pytest.raises(ConfigError, match="authorization"):
        config_from_mapping({"authorization": [entry]})


def test_groups_file_in_activemq_format(tmp_path: Path) -> None:
    f = tmp_path / "groups.properties"
    f.write_text("# ActiveMQ's groups.properties\nadmins=root\nusers=alice, carol\n\n")
    assert load_groups(f, {"users": ["dave"]}) == {"root": frozenset({"admins"}), "alice": frozenset({"users"}),
                                                   "carol": frozenset({"users"}), "dave": frozenset({"users"})}
    f.write_text("admins root\n")
    with pytest.raises(ConfigError, match="groups.properties:1: expected 'group=user1,user2'"):
        load_groups(f, {})
    with pytest.raises(ConfigError, match="cannot read groups file"):
        load_groups(tmp_path / "missing", {})


def test_entries_without_users_are_refused(tmp_path: Path) -> None:
    from amqtransport.broker.server import BrokerServer

    with pytest.raises(ConfigError, match="need users to authorize"):
        BrokerServer(BrokerConfig(authorization=ENTRIES), data_dir=tmp_path)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    d = tmp_path_factory.mktemp("authz")
    (d / "users.txt").write_text("alice:a\nbob:b\nroot:r\nwendy:w\n")
    (d / "groups.properties").write_text("admins=root\nusers=alice\nreaders=bob\nwriters=wendy\n")
    toml = ['groups_file = "%s"' % (d / "groups.properties")]
    for e in ENTRIES:
        toml.append("[[authorization]]")
        toml += [f"{k} = {v!r}".replace("'", '"') for k, v in e.items()]
    (d / "broker.toml").write_text("\n".join(toml) + "\n")
    with BrokerProcess(d / "data", args=["--users", str(d / "users.txt"), "--config", str(d / "broker.toml")]) as b:
        yield b


def connect(b: BrokerProcess, user: str, **kw: object) -> amqtransport.Connection:
    return amqtransport.connect(b.uri, login=user, passcode=user[0], **kw)  # type: ignore[arg-type]


def test_who_may_send_create_and_read(broker: BrokerProcess) -> None:
    with connect(broker, "bob") as bob:
        with pytest.raises(BrokerError, match="User bob is not authorized to write to: queue://orders.eu"):
            bob.send("/queue/orders.eu", "from bob")
    with connect(broker, "wendy") as wendy:  # write on audit, not admin: may not create it
        with pytest.raises(BrokerError, match="User wendy is not authorized to create: queue://audit"):
            wendy.send("/queue/audit", "first")
    with connect(broker, "root") as root:
        root.send("/queue/audit", "created by root")
    with connect(broker, "wendy") as wendy:  # now it exists: write is enough
        wendy.send("/queue/audit", "from wendy")
    with connect(broker, "alice") as alice:
        alice.send("/queue/orders.eu", "order 1")  # users may write and create under orders.>
        with pytest.raises(BrokerError, match="User alice is not authorized to read from: queue://audit"):
            alice.subscribe("/queue/audit").receive(timeout=2)
    with connect(broker, "bob") as bob:
        sub = bob.subscribe("/queue/orders.eu")
        m = sub.receive(timeout=5)
        assert m is not None and m.text == "order 1"
        with pytest.raises(BrokerError, match="User bob is not authorized to read from: queue://>"):
            bob.subscribe("/queue/>").receive(timeout=2)
    with connect(broker, "root") as root:
        sub = root.subscribe("/queue/audit")
        assert {sub.receive(timeout=5).text for _ in range(2)} == {"created by root", "from wendy"}  # type: ignore[union-attr]


def test_a_client_id_is_connected_once(broker: BrokerProcess) -> None:
    with connect(broker, "alice", client_id="svc-1") as first:
        with pytest.raises(BrokerError, match="CONNECT refused: client-id 'svc-1' is already connected from"):
            connect(broker, "alice", client_id="svc-1")
        first.send("/queue/orders.cid", "still works")
    with connect(broker, "alice", client_id="svc-1") as again:  # free once the first has gone
        again.send("/queue/orders.cid", "again")


def test_records_keep_the_owner_and_old_ones_still_decode() -> None:
    from amqtransport.broker.store.records import Sub, decode, encode

    for rec in (Sub("q", "t", "c", "n"), Sub("q", "t", "c", "n", "a = 1"), Sub("q", "t", "c", "n", "", "alice"),
                Sub("q", "t", "c", "n", "a = 1", "alice")):
        assert decode(encode(rec)) == rec
    assert encode(Sub("q", "t", "c", "n"))[0] == 6 and encode(Sub("q", "t", "c", "n", "x"))[0] == 12  # as before


def test_a_durable_subscription_belongs_to_its_maker_across_a_restart(tmp_path: Path) -> None:
    (tmp_path / "users.txt").write_text("alice:a\nbob:b\n")
    args = ["--users", str(tmp_path / "users.txt")]
    dest, sub_headers = "/topic/news", {"activemq.subscriptionName": "feed"}
    with BrokerProcess(tmp_path / "data", args=args) as b:
        with connect(b, "alice", client_id="reader") as alice:
            alice.subscribe(dest, headers=sub_headers).unsubscribe()  # detach; the subscription stays
        with connect(b, "alice") as alice:
            alice.send(dest, "for alice's feed")
        port = b.port
    with BrokerProcess(tmp_path / "data", port=port, args=args) as b:  # the owner is in the journal
        with connect(b, "bob", client_id="reader") as bob:
            with pytest.raises(BrokerError, match="durable subscription 'feed' of client 'reader' belongs to "
                                                  "another user"):
                bob.subscribe(dest, headers={**sub_headers, "selector": "1 = 1"}).receive(timeout=2)
        with connect(b, "alice", client_id="reader") as alice:
            m = alice.subscribe(dest, headers=sub_headers).receive(timeout=5)
            assert m is not None and m.text == "for alice's feed", "bob neither read nor replaced it"
