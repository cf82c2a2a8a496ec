"""The pure rules of amqtransport/otel/attributes.py: messaging.system per dialect,
server.address/port from a connected address, the body's size on the wire."""

from __future__ import annotations

from amqtransport.otel.attributes import body_size, messaging_system, server_of


def test_messaging_system_uses_the_conventions_values_and_ours() -> None:
    assert messaging_system("activemq") == "activemq"
    assert messaging_system("artemis") == "activemq"
    assert messaging_system("rabbitmq") == "rabbitmq"
    assert messaging_system("amq") == "amqtransport"
    assert messaging_system("generic") == "stomp"


def test_server_of_a_connected_address() -> None:
    assert server_of("tcp://127.0.0.1:61613") == ("127.0.0.1", 61613)
    assert server_of("ssl://broker.example:61614") == ("broker.example", 61614)
    assert server_of("127.0.0.1:5") == ("127.0.0.1", 5)
    assert server_of("tcp://[::1]:61613") == ("::1", 61613)
    assert server_of(None) is None and server_of("") is None
    assert server_of("tcp://host") is None and server_of("tcp://host:notaport") is None


def test_body_size_counts_utf8_bytes() -> None:
    assert body_size("héllo") == 6 and body_size(b"abc") == 3 and body_size(object()) is None
