"""The PyPI ``toxiproxy-python`` client drives our server unchanged, call by call.

Every call the client makes is exercised: update_api_consumer, running, version,
create, proxies, get_proxy, populate, reset, destroy, destroy_all; Proxy.add_toxic,
toxics, get_toxic, destroy_toxic, disable, enable, down, destroy. Where the client
hides the HTTP status, the same request is also made with ``requests``.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable

import pytest
import requests
from toxiproxy import Toxiproxy
from toxiproxy.exceptions import NotFound, ProxyExists

from amqtransport.testing.wait import wait_for as _wait_for
from chaos.proxy.server import ToxiproxyServer
from chaos.proxy.testing import UpstreamServer, connect, listen_addr, recv_exactly

pytestmark = pytest.mark.timeout(60)


def wait_for(predicate: Callable[[], object], timeout: float = 5.0) -> bool:
    return bool(_wait_for(predicate, timeout, interval=0.02))


def assert_closed(sock: socket.socket) -> None:
    """The peer closed the connection (EOF or reset), within the socket's timeout."""
    try:
        data = sock.recv(100)
    except ConnectionResetError:
        return
    assert data == b"", f"expected the connection to be closed, got {data!r}"


def test_running_and_version(toxi: Toxiproxy) -> None:
    assert toxi.running() is True
    assert json.loads(toxi.version()) == {"version": "2.12.0"}


def test_running_false_after_stop() -> None:
    server = ToxiproxyServer(port=0).start()
    client = Toxiproxy()
    client.update_api_consumer("127.0.0.1", server.port)
    assert client.running() is True
    server.stop()
    assert client.running() is False
    assert client.version() is None


def test_create_reports_real_listen_and_proxies_through(
    toxi: Toxiproxy, echo_server: UpstreamServer
) -> None:
    proxy = toxi.create(upstream=echo_server.address, name="echo")
    host, port = listen_addr(proxy.listen)
    assert host == "127.0.0.1" and port != 0
    assert proxy.upstream == echo_server.address and proxy.enabled is True
    assert set(toxi.proxies()) == {"echo"}
    fetched = toxi.get_proxy("echo")
    assert fetched is not None and fetched.listen == proxy.listen
    assert toxi.get_proxy("missing") is None
    with connect(proxy.listen) as sock:
        sock.sendall(b"hello through the proxy")
        assert recv_exactly(sock, 23) == b"hello through the proxy"


def test_create_duplicate_is_refused(
    toxi: Toxiproxy, toxiproxy_server: ToxiproxyServer, echo_server: UpstreamServer
) -> None:
    toxi.create(upstream=echo_server.address, name="dup")
    with pytest.raises(ProxyExists):
        toxi.create(upstream=echo_server.address, name="dup")
    # The client checks first; the server's own answer is a 409.
    reply = requests.post(
        f"{toxiproxy_server.url}/proxies",
        json={"name": "dup", "upstream": echo_server.address, "listen": "127.0.0.1:0"},
        timeout=5,
    )
    assert reply.status_code == 409
    assert reply.json() == {"error": "proxy already exists", "status": 409}


def test_create_returns_201_and_localhost_is_resolved(
    toxiproxy_server: ToxiproxyServer, echo_server: UpstreamServer
) -> None:
    reply = requests.post(
        f"{toxiproxy_server.url}/proxies",
        json={"name": "p", "upstream": echo_server.address, "listen": "localhost:0"},
        timeout=5,
    )
    assert reply.status_code == 201
    body = reply.json()
    assert body["listen"].startswith("127.0.0.1:") and not body["listen"].endswith(":0")
    assert body == {
        "name": "p",
        "listen": body["listen"],
        "upstream": echo_server.address,
        "enabled": True,
        "toxics": [],
    }


def test_disable_closes_live_connections_and_refuses_new_ones_enable_rebinds(
    toxi: Toxiproxy, toxiproxy_server: ToxiproxyServer, echo_server: UpstreamServer
) -> None:
    proxy = toxi.create(upstream=echo_server.address, name="echo")
    live = connect(proxy.listen)
    live.sendall(b"ping")
    assert recv_exactly(live, 4) == b"ping"
    assert echo_server.open == 1

    proxy.disable()
    assert proxy.enabled is False
    assert toxi.get_proxy("echo").enabled is False
    assert_closed(live)  # the client side is closed ...
    assert wait_for(lambda: echo_server.open == 0)  # ... and so is the upstream side
    assert toxiproxy_server.call(lambda c: len(c.get("echo").connections)) == 0
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(listen_addr(proxy.listen), timeout=2)
    live.close()

    proxy.enable()
    assert proxy.enabled is True
    again = toxi.get_proxy("echo")
    assert again.enabled is True and again.listen == proxy.listen  # same port
    with connect(proxy.listen) as sock:
        sock.sendall(b"back")
        assert recv_exactly(sock, 4) == b"back"


def test_disable_and_enable_reply_with_proxy_json(
    toxiproxy_server: ToxiproxyServer, echo_server: UpstreamServer
) -> None:
    url = toxiproxy_server.url
    requests.post(f"{url}/proxies", json={"name": "p", "upstream": echo_server.address}, timeout=5)
    off = requests.post(f"{url}/proxies/p", json={"enabled": False}, timeout=5)
    assert off.status_code == 200 and off.json()["enabled"] is False
    on = requests.patch(f"{url}/proxies/p", json={"enabled": True}, timeout=5)
    assert on.status_code == 200 and on.json()["enabled"] is True


def test_down_context_manager(toxi: Toxiproxy, echo_server: UpstreamServer) -> None:
    proxy = toxi.create(upstream=echo_server.address, name="echo")
    with proxy.down():
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(listen_addr(proxy.listen), timeout=2)
    with connect(proxy.listen) as sock:
        sock.sendall(b"up")
        assert recv_exactly(sock, 2) == b"up"


def test_create_disabled_then_enable(toxi: Toxiproxy, echo_server: UpstreamServer) -> None:
    proxy = toxi.create(upstream=echo_server.address, name="later", enabled=False)
    assert proxy.enabled is False
    proxy.enable()
    live = toxi.get_proxy("later")
    assert listen_addr(live.listen)[1] != 0
    with connect(live.listen) as sock:
        sock.sendall(b"ok")
        assert recv_exactly(sock, 2) == b"ok"


def test_toxics_add_list_get_destroy(
    toxi: Toxiproxy, toxiproxy_server: ToxiproxyServer, echo_server: UpstreamServer
) -> None:
    proxy = toxi.create(upstream=echo_server.address, name="echo")
    proxy.add_toxic(type="latency", attributes={"latency": 10})
    proxy.add_toxic(
        type="bandwidth", stream="upstream", name="bw", toxicity=0.5, attributes={"rate": 1000}
    )
    toxics = proxy.toxics()
    assert set(toxics) == {"latency_downstream", "bw"}
    latency = toxics["latency_downstream"]
    assert (latency.type, latency.stream, latency.toxicity) == ("latency", "downstream", 1.0)
    assert latency.attributes == {"latency": 10, "jitter": 0}  # zero-filled
    bw = proxy.get_toxic("bw")
    assert (bw.type, bw.stream, bw.toxicity, bw.attributes) == (
        "bandwidth",
        "upstream",
        0.5,
        {"rate": 1000},
    )
    assert proxy.get_toxic("nope") is None
    # the proxy JSON carries its toxics, in creation order
    listed = requests.get(f"{toxiproxy_server.url}/proxies/echo", timeout=5).json()["toxics"]
    assert [t["name"] for t in listed] == ["latency_downstream", "bw"]
    one = requests.get(f"{toxiproxy_server.url}/proxies/echo/toxics/bw", timeout=5)
    assert one.status_code == 200 and one.json()["attributes"] == {"rate": 1000}

    assert proxy.destroy_toxic("bw") is True
    assert set(proxy.toxics()) == {"latency_downstream"}
    with pytest.raises(NotFound):
        proxy.destroy_toxic("bw")
    with pytest.raises(ProxyExists):  # the client maps 409 to ProxyExists
        proxy.add_toxic(type="latency", attributes={"latency": 5})


def test_toxic_update_merges_attributes(
    toxiproxy_server: ToxiproxyServer, echo_server: UpstreamServer
) -> None:
    url = toxiproxy_server.url
    requests.post(f"{url}/proxies", json={"name": "p", "upstream": echo_server.address}, timeout=5)
    created = requests.post(
        f"{url}/proxies/p/toxics",
        json={"type": "latency", "attributes": {"latency": 100, "jitter": 5}},
        timeout=5,
    )
    assert created.status_code == 200
    assert created.json() == {
        "attributes": {"latency": 100, "jitter": 5},
        "name": "latency_downstream",
        "type": "latency",
        "stream": "downstream",
        "toxicity": 1.0,
    }
    updated = requests.patch(
        f"{url}/proxies/p/toxics/latency_downstream",
        json={"attributes": {"latency": 7}, "toxicity": 0.25},
        timeout=5,
    )
    assert updated.status_code == 200
    assert updated.json()["attributes"] == {"latency": 7, "jitter": 5}
    assert updated.json()["toxicity"] == 0.25
    deleted = requests.delete(f"{url}/proxies/p/toxics/latency_downstream", timeout=5)
    assert deleted.status_code == 204
    assert requests.get(f"{url}/proxies/p/toxics", timeout=5).json() == []


def test_destroy_proxy(toxi: Toxiproxy, echo_server: UpstreamServer) -> None:
    proxy = toxi.create(upstream=echo_server.address, name="gone")
    live = connect(proxy.listen)
    assert toxi.destroy(proxy) is True
    assert toxi.proxies() == {}
    assert_closed(live)
    live.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(listen_addr(proxy.listen), timeout=2)
    with pytest.raises(NotFound):
        proxy.destroy()
    assert toxi.destroy("not a proxy") is False


def test_destroy_all(toxi: Toxiproxy, echo_server: UpstreamServer) -> None:
    toxi.create(upstream=echo_server.address, name="a")
    toxi.create(upstream=echo_server.address, name="b")
    toxi.destroy_all()
    assert toxi.proxies() == {}


def test_reset_enables_all_and_removes_toxics(toxi: Toxiproxy, echo_server: UpstreamServer) -> None:
    a = toxi.create(upstream=echo_server.address, name="a")
    b = toxi.create(upstream=echo_server.address, name="b")
    a.add_toxic(type="latency", attributes={"latency": 1000})
    b.disable()
    assert toxi.reset() is True
    assert a.toxics() == {}
    assert toxi.get_proxy("b").enabled is True
    for proxy in (a, b):
        with connect(proxy.listen) as sock:
            sock.sendall(b"x")
            assert recv_exactly(sock, 1) == b"x"


def test_client_populate(toxi: Toxiproxy, echo_server: UpstreamServer) -> None:
    created = toxi.populate(
        [
            {"name": "one", "upstream": echo_server.address, "listen": "127.0.0.1:0"},
            {"name": "two", "upstream": echo_server.address},
        ]
    )
    assert sorted(p.name for p in created) == ["one", "two"]
    one = toxi.get_proxy("one")
    # same listen and upstream: the proxy is kept, not recreated
    assert toxi.populate([{"name": "one", "upstream": one.upstream, "listen": one.listen}]) == []
    assert toxi.get_proxy("one").listen == one.listen


def test_server_populate(toxiproxy_server: ToxiproxyServer, echo_server: UpstreamServer) -> None:
    url = toxiproxy_server.url
    first = requests.post(
        f"{url}/populate",
        json=[
            {"name": "x", "upstream": echo_server.address},
            {"name": "y", "upstream": echo_server.address, "enabled": False},
        ],
        timeout=5,
    )
    assert first.status_code == 201
    proxies = {p["name"]: p for p in first.json()["proxies"]}
    assert proxies["x"]["enabled"] is True and proxies["y"]["enabled"] is False
    x_listen = proxies["x"]["listen"]
    again = requests.post(
        f"{url}/populate",
        json=[{"name": "x", "upstream": echo_server.address, "listen": x_listen}],
        timeout=5,
    )
    assert again.status_code == 201 and again.json()["proxies"][0]["listen"] == x_listen
    missing = requests.post(f"{url}/populate", json=[{"name": "z"}], timeout=5)
    assert missing.status_code == 400
    assert missing.json()["error"] == "missing required field: upstream at proxy 1"


def test_update_upstream_and_listen(
    toxiproxy_server: ToxiproxyServer, echo_server: UpstreamServer, greet_server: UpstreamServer
) -> None:
    url = toxiproxy_server.url
    requests.post(f"{url}/proxies", json={"name": "p", "upstream": echo_server.address}, timeout=5)
    moved = requests.post(f"{url}/proxies/p", json={"upstream": greet_server.address}, timeout=5)
    assert moved.status_code == 200 and moved.json()["upstream"] == greet_server.address
    assert moved.json()["enabled"] is True
    with connect(moved.json()["listen"]) as sock:
        assert recv_exactly(sock, 3) == b"bye"


def test_failed_upstream_dial_closes_the_client(toxi: Toxiproxy) -> None:
    spare = socket.create_server(("127.0.0.1", 0))
    dead = f"127.0.0.1:{spare.getsockname()[1]}"
    spare.close()  # nothing listens there now
    proxy = toxi.create(upstream=dead, name="dead")
    with connect(proxy.listen) as sock:  # the connect itself succeeds ...
        assert_closed(sock)  # ... then the proxy closes it
    assert toxi.get_proxy("dead").enabled is True


def test_unknown_path_and_wrong_method(toxiproxy_server: ToxiproxyServer) -> None:
    url = toxiproxy_server.url
    missing = requests.get(f"{url}/nothing/here", timeout=5)
    assert missing.status_code == 404 and missing.json()["status"] == 404
    wrong = requests.delete(f"{url}/version", timeout=5)
    assert wrong.status_code == 405 and wrong.json()["status"] == 405
    assert requests.get(f"{url}/proxies/nope", timeout=5).json() == {
        "error": "proxy not found",
        "status": 404,
    }


def test_a_burst_of_connects_waits_in_the_accept_queue_while_the_proxy_is_busy(
    toxi: Toxiproxy, toxiproxy_server: ToxiproxyServer, echo_server: UpstreamServer
) -> None:
    """The listener's backlog is the system's (``net.core.somaxconn``), as Go's listener
    under Toxiproxy has it, not 128: 300 connects made while the proxy's loop is busy all
    complete in the kernel, and the disable that follows closes every one of them.

    With a queue of 128 the kernel drops the SYNs beyond it (the client retries after its
    one-second retransmission timer) or, for connects already half made, the client's last
    ACK, and such a client believes it is connected to a listener that never hears of it:
    a disable then leaves it connected to nothing (the storm test below failed so on CI)."""
    proxy = toxi.create(upstream=echo_server.address, name="burst")
    asleep = threading.Event()

    def busy(_: object) -> None:
        asleep.set()
        time.sleep(1.5)

    sleeper = threading.Thread(target=toxiproxy_server.call, args=(busy,), daemon=True)
    sleeper.start()
    assert asleep.wait(5)
    socks: list[socket.socket] = []
    try:
        for _ in range(300):  # each within half the SYN retransmission timer, or not at all
            socks.append(socket.create_connection(listen_addr(proxy.listen), timeout=0.5))
        sleeper.join(timeout=10)
        proxy.disable()
        for sock in socks:
            sock.settimeout(5)
            assert_closed(sock)
    finally:
        for sock in socks:
            sock.close()
    assert wait_for(lambda: echo_server.open == 0)


def test_disable_enable_during_a_connect_storm_leaves_nothing_behind(
    toxi: Toxiproxy, toxiproxy_server: ToxiproxyServer, echo_server: UpstreamServer
) -> None:
    """Clients reconnect in a tight loop while the proxy flaps: every connection the
    proxy accepted is closed by the final disable, upstream side included."""
    proxy = toxi.create(upstream=echo_server.address, name="storm")
    stop = threading.Event()
    held: list[socket.socket] = []
    lock = threading.Lock()

    def client() -> None:
        while not stop.is_set():
            try:
                sock = socket.create_connection(listen_addr(proxy.listen), timeout=2)
            except OSError:
                time.sleep(0.005)
                continue
            with lock:
                held.append(sock)  # kept open: the proxy must close it
            # a few hundred in all: four descriptors each in this process (client, proxy's two,
            # echo server); unthrottled, with no accept queue overflow to slow it, thousands
            time.sleep(0.005)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(15):
            time.sleep(0.04)
            proxy.disable()
            time.sleep(0.01)
            proxy.enable()
        time.sleep(0.05)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=5)
    proxy.disable()
    assert 15 < len(held) < 2000, f"{len(held)} connections: too few to test anything, or too many"
    for sock in held:
        sock.settimeout(5)
        assert_closed(sock)
        sock.close()
    assert toxiproxy_server.call(lambda c: len(c.get("storm").connections)) == 0
    assert wait_for(lambda: echo_server.open == 0)
    proxy.enable()
    with connect(proxy.listen) as sock:
        sock.sendall(b"calm")
        assert recv_exactly(sock, 4) == b"calm"
