"""The ActiveMQ option catalogue (amqtransport/activemq_options.py) without a JVM: ActiveMQ's name
rules, what the socket and TLS settings do to a real socket, explain's lines, and the docs table."""

from __future__ import annotations

import json
import socket
import ssl
from pathlib import Path

import pytest
from click.testing import CliRunner

from amqtransport import activemq_options as amq
from amqtransport._backends.sockets import SocketBackend, apply_socket_settings, build_ssl_context
from amqtransport.cli.main import cli
from amqtransport.errors import UriError
from amqtransport.transports.link import ConnectParams, connect_timeout_for
from amqtransport.uri import CompositeUri, LeafUri, parse_uri

DOCS = Path(__file__).resolve().parents[2] / "docs" / "uris.md"


def leaf(text: str) -> LeafUri:
    node = parse_uri(text)
    assert isinstance(node, LeafUri)
    return node


@pytest.mark.parametrize(("key", "found"), [
    ("randomize", "randomize"), ("Randomize", "randomize"), ("RANDOMIZE", None),
    ("wireFormat.MaxInactivityDuration", "wireFormat.maxInactivityDuration"),
    ("WireFormat.maxInactivityDuration", None), ("wireformat.maxInactivityDuration", None),
    ("jms.prefetchPolicy.All", "jms.prefetchPolicy.all"), ("jms.PrefetchPolicy.all", None),
    ("soWriteTimeout", "soWriteTimeout"), ("SoWriteTimeout", None),  # read from the map by its exact name
    ("socket.oOBInline", "socket.OOBInline"),
])
def test_lookup_follows_activemqs_bean_rule(key: str, found: str | None) -> None:
    scope: amq.Scope = "jms" if key.startswith("jms.") else ("failover" if key.lower() == "randomize" else "transport")
    option = amq.lookup(scope, key)
    assert (option.name if option else None) == found


@pytest.mark.parametrize(("java", "value", "ok"), [
    ("int", "5", True), ("int", "+5", True), ("int", " 5", False), ("int", "2147483648", False),
    ("long", "2147483648", True), ("short", "70000", False), ("boolean", "TRUE", True), ("boolean", "yes", False),
    ("double", "2.5", True), ("double", "2d", True), ("double", "x", False), ("tos", "256", False),
    ("dscp", "EF", True), ("dscp", "AF51", False), ("dscp", "63", True), ("openwire", "13", False),
    ("protocols", "TLSv1.2,TLSv1.3", True), ("protocols", "TLS1.2", False), ("String", "", True),
])
def test_java_values(java: str, value: str, ok: bool) -> None:
    assert (amq.java_value_error(java, value) is None) is ok


def test_bad_values_and_misplaced_options_are_errors_naming_the_option() -> None:
    for text, option in [("tcp://h:1?connectionTimeout=+5", "connectionTimeout"),
                         ("tcp://h:1?socket.verifyHostName=false", "socket.verifyHostName"),
                         ("ssl://h:1?socket.OOBInline=true", "socket.OOBInline"),
                         ("static:(failover:(tcp://a:1)?jms.clientID=x)", "jms.clientID"),
                         ("tcp://h:1?useInactivityMonitor=false&readCheckTime=5", "readCheckTime"),
                         ("vm://b?trace=true", "trace"),  # our in-process broker: no TCP options
                         ("failover:(vm://b)?nested.trace=true", "nested.trace")]:
        with pytest.raises(UriError) as info:
            parse_uri(text)
        assert info.value.option == option, (text, str(info.value))


def test_socket_settings_reach_a_real_socket() -> None:
    settings = amq.socket_settings(leaf("tcp://h:1?keepAlive=true&tcpNoDelay=false&socketBufferSize=65536"
                                        "&soLinger=3&diffServ=EF").amq)
    server = socket.create_server(("127.0.0.1", 0))
    with server, socket.create_connection(server.getsockname()) as sock:
        apply_socket_settings(sock, settings)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) >= 65536  # Linux doubles it
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_LINGER) != 0
        assert sock.getsockopt(socket.IPPROTO_IP, socket.IP_TOS) == 46 << 2


def test_socket_options_win_over_the_plain_names_and_nodelay_stays_on() -> None:
    settings = amq.socket_settings(leaf("tcp://h:1?keepAlive=false&socket.keepAlive=true").amq)
    assert settings.keep_alive is True and settings.tcp_no_delay is True


def test_so_write_timeout_is_the_streams_write_timeout() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    with server:
        port = server.getsockname()[1]
        stream = SocketBackend().connect(leaf(f"tcp://127.0.0.1:{port}?soWriteTimeout=1500"), 5.0)
        try:
            assert stream._sock.gettimeout() == 1.5
        finally:
            stream.close()


def test_tls_settings() -> None:
    node = leaf("ssl://h:1?socket.verifyHostName=false&socket.enabledProtocols=TLSv1.3")
    ctx = build_ssl_context(node.options, amq.socket_settings(node.amq))
    assert ctx.check_hostname is False and ctx.verify_mode == ssl.CERT_REQUIRED  # the chain is still checked
    assert ctx.minimum_version == ctx.maximum_version == ssl.TLSVersion.TLSv1_3
    assert build_ssl_context(leaf("ssl://h:1").options).check_hostname is True


def test_connection_timeout_is_the_connect_timeout_and_zero_means_no_limit() -> None:
    assert connect_timeout_for(leaf("tcp://h:1?connectionTimeout=2500"), ConnectParams()) == 2.5
    assert connect_timeout_for(leaf("tcp://h:1?connectionTimeout=0"), ConnectParams()) >= 3600


def test_explain_says_what_every_activemq_option_became() -> None:
    text = "failover:(tcp://a:1?trace=true)?updateURIsSupported=false&jms.prefetchPolicy.all=5"
    human = CliRunner().invoke(cli, ["uri", "explain", text])
    assert human.exit_code == 0, human.output
    assert "trace=true -> ignored:" in human.stdout
    assert "updateURIsSupported=false -> ignored:" in human.stdout
    assert "jms.prefetchPolicy.all=5 -> became: the prefetch of every subscription" in human.stdout
    doc = json.loads(CliRunner().invoke(cli, ["uri", "explain", "--json", text]).stdout)
    assert "OpenWire" in doc["meanings"]["updateURIsSupported"]["ignored"]
    assert doc["meanings"]["jms.prefetchPolicy.all"] == {"value": "5", "became": amq.lookup(
        "jms", "jms.prefetchPolicy.all").became}  # type: ignore[union-attr]
    assert doc["components"][0]["meanings"]["trace"]["value"] == "true"
    assert "meanings" not in json.loads(CliRunner().invoke(cli, ["uri", "explain", "--json", "tcp://a:1"]).stdout)


def test_every_catalogued_option_is_in_the_docs_table() -> None:
    page = DOCS.read_text()
    missing = [o.name for table in amq.TABLES.values() for o in table if f"| `{o.name}` |" not in page]
    assert not missing, missing


def test_canonical_form_keeps_activemq_options_and_round_trips() -> None:
    for text in ["nio+ssl://h:1?verifyHostName=false&jms.useAsyncSend=true",
                 "failover:(stomp+nio://a:1,tcp://b:2?trace=true)?Randomize=false&updateURIsSupported=false",
                 "failover:tcp://a:1?soTimeout=10"]:
        node = parse_uri(text)
        assert parse_uri(str(node)) == node, str(node)
    node = parse_uri("failover:(tcp://a:1?trace=false,tcp://b:2)?nested.trace=true")
    assert isinstance(node, CompositeUri)
    assert [c.amq for c in node.components] == [(("trace", "false"),), (("trace", "true"),)]  # its own wins


def test_a_negative_static_limit_is_unlimited_as_in_activemq() -> None:
    # SimpleDiscoveryAgent stops only past a positive maxReconnectAttempts (refused here before issue 29)
    node = parse_uri("static:(tcp://a:1)?maxReconnectAttempts=-1")
    assert isinstance(node, CompositeUri) and node.options.max_reconnect_attempts == 0  # type: ignore[union-attr]
