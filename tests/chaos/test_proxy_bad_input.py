"""Bad input gets the documented status and a message naming what is wrong; the server
keeps serving afterwards (every test ends with a request that must succeed).

Also hypothesis fuzz tests for each parser: raw bytes to the API's HTTP server (the
broker's h11 server, fuzzed on its own in tests/http/test_parsers.py), ``host:port``
addresses, toxic attributes, and whole request bodies through the API handler.
"""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from toxiproxy import Toxiproxy
from toxiproxy.exceptions import InvalidToxic

from amqtransport.broker.http.h11_server import Request
from chaos.proxy.addresses import format_hostport, parse_hostport
from chaos.proxy.collection import ProxyCollection, ProxyConfig
from chaos.proxy.errors import BadRequest
from chaos.proxy.http_api import ToxiproxyApi
from chaos.proxy.server import ToxiproxyServer
from chaos.proxy.testing import UpstreamServer
from chaos.proxy.toxics import TOXIC_TYPES, ToxicConfigError, make_toxic

pytestmark = pytest.mark.timeout(60)


def still_serving(server: ToxiproxyServer) -> None:
    reply = requests.get(f"{server.url}/version", timeout=5)
    assert reply.status_code == 200 and reply.json() == {"version": "2.12.0"}


def post(server: ToxiproxyServer, path: str, body: bytes | object) -> requests.Response:
    if isinstance(body, bytes):
        return requests.post(
            f"{server.url}{path}",
            data=body,
            headers={"Content-Type": "application/json"},
            timeout=5,
        )
    return requests.post(f"{server.url}{path}", json=body, timeout=5)


@pytest.mark.parametrize(
    "body, message",
    [
        (b"{not json", "bad request body"),
        (b"", "bad request body"),
        (b"[1, 2]", "bad request body"),
        (b'{"upstream": "127.0.0.1:1"}', "missing required field: name"),
        (b'{"name": "x"}', "missing required field: upstream"),
        (b'{"name": 5, "upstream": "127.0.0.1:1"}', "'name' must be a string"),
        (b'{"name": "x", "upstream": "nowhere"}', "upstream 'nowhere': missing ':port'"),
        (b'{"name": "x", "upstream": "h:1", "listen": "h:99999"}', "port must be a number"),
        (b'{"name": "x", "upstream": "h:1", "enabled": "yes"}', "'enabled' must be true or false"),
    ],
)
def test_bad_proxy_bodies_are_400(
    toxiproxy_server: ToxiproxyServer, body: bytes, message: str
) -> None:
    reply = post(toxiproxy_server, "/proxies", body)
    assert reply.status_code == 400
    assert reply.json()["status"] == 400
    assert message in reply.json()["error"]
    assert requests.get(f"{toxiproxy_server.url}/proxies", timeout=5).json() == {}
    still_serving(toxiproxy_server)


def test_bad_toxics_are_400(
    toxi: Toxiproxy, toxiproxy_server: ToxiproxyServer, echo_server: UpstreamServer
) -> None:
    proxy = toxi.create(upstream=echo_server.address, name="p")
    with pytest.raises(InvalidToxic, match="invalid toxic type"):
        proxy.add_toxic(type="nonsense")
    cases = [
        ({"type": "latency", "attributes": {"latency": -5}}, "'latency' must be >= 0"),
        ({"type": "latency", "attributes": {"latency": 1.5}}, "must be an integer"),
        ({"type": "latency", "attributes": {"latency": "100"}}, "must be an integer"),
        ({"type": "latency", "attributes": [1]}, "attributes must be a JSON object"),
        ({"type": "latency", "stream": "sideways"}, "stream was invalid"),
        ({"type": "latency", "toxicity": 2}, "toxicity must be between 0 and 1"),
        ({"type": "latency", "toxicity": "high"}, "toxicity must be a number"),
        ({"attributes": {}}, "invalid toxic type"),
        ({"type": 7}, "'type' must be a string"),
    ]
    for body, message in cases:
        reply = post(toxiproxy_server, "/proxies/p/toxics", body)
        assert reply.status_code == 400, body
        assert message in reply.json()["error"], (body, reply.json())
    bad_json = post(toxiproxy_server, "/proxies/p/toxics", b'{"type": ')
    assert bad_json.status_code == 400
    assert proxy.toxics() == {}
    # a bad update leaves the toxic as it was
    proxy.add_toxic(type="latency", attributes={"latency": 10})
    reply = post(
        toxiproxy_server, "/proxies/p/toxics/latency_downstream", {"attributes": {"jitter": -1}}
    )
    assert reply.status_code == 400
    assert proxy.get_toxic("latency_downstream").attributes == {"latency": 10, "jitter": 0}
    still_serving(toxiproxy_server)


def test_not_found_and_conflicts(
    toxiproxy_server: ToxiproxyServer, echo_server: UpstreamServer
) -> None:
    url = toxiproxy_server.url
    assert requests.delete(f"{url}/proxies/ghost", timeout=5).status_code == 404
    assert requests.get(f"{url}/proxies/ghost/toxics", timeout=5).status_code == 404
    assert post(toxiproxy_server, "/proxies/ghost", {"enabled": True}).status_code == 404
    post(toxiproxy_server, "/proxies", {"name": "p", "upstream": echo_server.address})
    ghost = requests.get(f"{url}/proxies/p/toxics/ghost", timeout=5)
    assert ghost.status_code == 404 and ghost.json() == {"error": "toxic not found", "status": 404}
    assert requests.delete(f"{url}/proxies/p/toxics/ghost", timeout=5).status_code == 404
    assert post(toxiproxy_server, "/proxies/p/toxics", {"type": "noop"}).status_code == 200
    dup = post(toxiproxy_server, "/proxies/p/toxics", {"type": "noop"})
    assert dup.json() == {"error": "toxic already exists", "status": 409}
    # toxic names are unique across both streams
    same_name = post(
        toxiproxy_server,
        "/proxies/p/toxics",
        {"type": "latency", "stream": "upstream", "name": "noop_downstream"},
    )
    assert same_name.status_code == 409
    still_serving(toxiproxy_server)


def test_listen_address_in_use_is_500_and_server_keeps_serving(
    toxi: Toxiproxy, toxiproxy_server: ToxiproxyServer, echo_server: UpstreamServer
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        reply = post(
            toxiproxy_server,
            "/proxies",
            {"name": "clash", "upstream": echo_server.address, "listen": f"127.0.0.1:{port}"},
        )
        assert reply.status_code == 500
        assert reply.json() == {
            "error": f"listen tcp 127.0.0.1:{port}: bind: address already in use",
            "status": 500,
        }
        assert "clash" not in toxi.proxies()
        # the PyPI client lets a 500 through and then fails on the missing name
        with pytest.raises(KeyError):
            toxi.create(upstream=echo_server.address, name="clash", listen=f"127.0.0.1:{port}")
        # enabling a proxy whose port was taken meanwhile is a 500 too
        proxy = toxi.create(upstream=echo_server.address, name="moved")
        proxy.disable()
        moved = post(
            toxiproxy_server, "/proxies/moved", {"listen": f"127.0.0.1:{port}", "enabled": True}
        )
        assert moved.status_code == 500 and "address already in use" in moved.json()["error"]
    assert toxi.create(upstream=echo_server.address, name="fine").enabled is True
    still_serving(toxiproxy_server)


@pytest.mark.parametrize(
    "raw, status",
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET /version HTTP/2.0\r\nHost: x\r\n\r\n", 505),
        (b"GET /version HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", 400),
        (b"GET /version HTTP/1.1\r\n\r\n", 400),  # HTTP/1.1 without Host, as Go's server says
        (b"POST /proxies HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n", 400),
        (b"POST /proxies HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n", 413),
        (b"POST /proxies HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
        (b"GET /version HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 70000 + b"\r\n\r\n", 431),
    ],
)
def test_malformed_http_gets_an_error_and_server_keeps_serving(
    toxiproxy_server: ToxiproxyServer, raw: bytes, status: int
) -> None:
    with socket.create_connection(("127.0.0.1", toxiproxy_server.port), timeout=5) as sock:
        sock.sendall(raw)
        reply = bytearray()
        while chunk := sock.recv(65536):
            reply += chunk
    head, _, body = bytes(reply).partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ".encode())
    assert json.loads(body)["status"] == status
    still_serving(toxiproxy_server)


def test_keep_alive_and_chunked_bodies(toxiproxy_server: ToxiproxyServer) -> None:
    body = b'{"name": "c", "upstream": "127.0.0.1:9", "enabled": false}'
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    with socket.create_connection(("127.0.0.1", toxiproxy_server.port), timeout=5) as sock:
        sock.sendall(
            b"POST /proxies HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            + chunked
            + b"GET /proxies/c HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        reply = bytearray()
        while chunk := sock.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 201 Created\r\n")
    assert reply.count(b"HTTP/1.1 ") == 2 and b"HTTP/1.1 200 OK" in reply


# -- fuzz --------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(min_size=1, max_size=300))
def test_fuzz_raw_bytes_get_a_json_error_or_a_close(toxiproxy_server: ToxiproxyServer, data: bytes) -> None:
    """Any bytes to the API port: an answer whose body is Toxiproxy's JSON (a request that
    happens to be valid gets its route's answer), or a close; the server keeps serving."""
    with socket.create_connection(("127.0.0.1", toxiproxy_server.port), timeout=5) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        reply = bytearray()
        try:
            while chunk := sock.recv(65536):
                reply += chunk
        except ConnectionResetError:
            pass
    if reply:
        head, _, body = bytes(reply).partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if status >= 400:
            answer = json.loads(body)
            assert answer["status"] == status and answer["error"]
    still_serving(toxiproxy_server)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_fuzz_hostport_only_raises_bad_request(text: str) -> None:
    try:
        host, port = parse_hostport(text)
    except BadRequest as exc:
        assert str(exc)
    else:
        assert 0 <= port <= 65535
        assert parse_hostport(format_hostport(host, port)) == (host, port)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([*TOXIC_TYPES, "bogus"]),
    st.dictionaries(
        st.sampled_from(
            [
                "latency",
                "jitter",
                "rate",
                "delay",
                "timeout",
                "bytes",
                "average_size",
                "size_variation",
                "other",
            ]
        ),
        st.one_of(
            st.integers(-10, 2**64),
            st.floats(allow_nan=True),
            st.text(max_size=3),
            st.booleans(),
            st.none(),
            st.lists(st.integers(), max_size=2),
        ),
        max_size=4,
    ),
)
def test_fuzz_toxic_attributes_only_raise_config_error(type_name: str, attributes: dict) -> None:  # type: ignore[type-arg]
    try:
        toxic = make_toxic(type_name, attributes)
    except ToxicConfigError as exc:
        assert str(exc)
    else:
        assert all(isinstance(v, int) and 0 <= v < 2**63 for v in toxic.attributes().values())


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 10**6)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=10,
)
toxic_bodies = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from([*TOXIC_TYPES, "x"]) | json_values,
        "name": st.text(max_size=6) | json_values,
        "stream": st.sampled_from(["upstream", "downstream", "up"]) | json_values,
        "toxicity": st.floats(-1, 2) | json_values,
        "attributes": st.dictionaries(
            st.sampled_from(["latency", "rate", "bytes", "delay"]), json_values, max_size=3
        )
        | json_values,
    },
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["POST", "PATCH", "DELETE", "GET"]),
            st.sampled_from(
                [
                    "/proxies/p/toxics",
                    "/proxies/p/toxics/latency_downstream",
                    "/proxies/p",
                    "/proxies",
                    "/populate",
                ]
            ),
            toxic_bodies | json_values,
        ),
        min_size=1,
        max_size=6,
    )
)
def test_fuzz_api_bodies_never_cause_500(requests_: list[tuple[str, str, object]]) -> None:
    """Random JSON to the API: only documented statuses, never an internal error."""

    async def run() -> None:
        collection = ProxyCollection()
        api = ToxiproxyApi(collection)
        await collection.create(ProxyConfig(name="p", upstream="127.0.0.1:9", enabled=False))
        try:
            for method, path, body in requests_:
                if path in ("/proxies", "/populate") and method == "POST":
                    continue  # would bind real ports; covered by the socket tests above
                if path == "/proxies/p" and isinstance(body, dict) and body.get("enabled") is True:
                    continue
                raw = json.dumps(body).encode()
                request = Request(method, path, path, {}, {"content-length": str(len(raw))}, raw, "fuzz")
                response = await api(request)
                assert response.status in (200, 201, 204, 400, 404, 405, 409), response
                if response.status >= 400:
                    assert json.loads(response.body)["status"] == response.status
                if path == "/proxies/p" and method == "DELETE":
                    await collection.create(
                        ProxyConfig(name="p", upstream="127.0.0.1:9", enabled=False)
                    )
        finally:
            collection.close()

    asyncio.run(run())
