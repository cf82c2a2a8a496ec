"""Socket and TLS backends against a tiny scripted STOMP peer on real sockets, and a fuzz
of what a peer may send after CONNECTED."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import amqtransport
from amqtransport._backends.memory import MemoryBackend, MemoryStream
from amqtransport._backends.sockets import SocketBackend
from amqtransport.errors import ConnectError, ConnectionClosed, TransportError, WriteError
from amqtransport.stomp import Frame, FrameParser, serialize
from amqtransport.uri import parse_uri

pytestmark = pytest.mark.timeout(60)


class ScriptedPeer:
    """A one-thread STOMP peer: CONNECTED for CONNECT, RECEIPT for every receipt header."""

    def __init__(self, context: ssl.SSLContext | None = None) -> None:
        self.context = context
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.frames: list[Frame] = []
        self.errors: list[BaseException] = []
        self._stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop:
            try:
                raw, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._handle, args=(raw,), daemon=True).start()

    def _handle(self, raw: socket.socket) -> None:
        conn: socket.socket = raw
        try:
            raw.settimeout(5)
            if self.context is not None:
                conn = self.context.wrap_socket(raw, server_side=True)
            parser = FrameParser()
            while True:
                data = conn.recv(65536)
                if not data:
                    return
                parser.feed(data)
                for ev in parser.events():
                    if not isinstance(ev, Frame):
                        continue
                    self.frames.append(ev)
                    if ev.command == "CONNECT":
                        conn.sendall(serialize(Frame.make("CONNECTED", {"version": "1.2", "heart-beat": "0,0"})))
                    elif ev.get("receipt") is not None:
                        conn.sendall(serialize(Frame.make("RECEIPT", {"receipt-id": ev.get("receipt")})))
                    if ev.command == "DISCONNECT":
                        return
        except (OSError, ssl.SSLError) as exc:
            self.errors.append(exc)
        finally:
            conn.close()

    def close(self) -> None:
        self._stop = True
        self.sock.close()
        self.thread.join(2)


@pytest.fixture
def peer() -> Iterator[ScriptedPeer]:
    p = ScriptedPeer()
    yield p
    p.close()


def test_plain_socket_roundtrip(peer: ScriptedPeer) -> None:
    with amqtransport.connect(f"tcp://127.0.0.1:{peer.port}", login="u", passcode="p") as conn:
        conn.send("/queue/x", "hello", idempotency_key="k")
        with conn.producer(window=5) as prod:
            for i in range(20):
                prod.send("/queue/x", f"m{i}")
    sends = [f for f in peer.frames if f.command == "SEND"]
    assert len(sends) == 21 and sends[0].get("amq-idempotency-key") == "k" and sends[0].body == b"hello"
    assert peer.frames[0].get("login") == "u"


def test_connect_refused_and_timeout_map_to_connect_error() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(ConnectError, match="connect failed"):
        SocketBackend().connect(parse_uri(f"tcp://127.0.0.1:{port}"), 2)
    # a listener that never answers the STOMP handshake
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)
    try:
        t0 = time.monotonic()
        with pytest.raises(ConnectError, match="no CONNECTED"):
            amqtransport.connect(f"tcp://127.0.0.1:{silent.getsockname()[1]}?connectTimeout=300")
        assert time.monotonic() - t0 < 3
    finally:
        silent.close()


# -- SocketStream: writes that do not fit, a peer that never reads, close under a reader --


@pytest.fixture
def raw_pair() -> Iterator[tuple[socket.socket, int]]:
    """A listening socket and its port (the test accepts)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    yield srv, srv.getsockname()[1]
    srv.close()


def test_a_write_bigger_than_the_socket_buffers_arrives_whole_and_in_order(
        raw_pair: tuple[socket.socket, int]) -> None:
    """A plain stream tries one send without a timeout first; what the kernel did not
    take goes out through sendall: a slow reader still gets every byte, in order."""
    srv, port = raw_pair
    stream = SocketBackend().connect(parse_uri(f"tcp://127.0.0.1:{port}"), 5)
    peer, _ = srv.accept()
    data = bytes(range(256)) * (8 * 4096)  # 8 MiB: far more than both socket buffers
    got = bytearray()

    def read_slowly() -> None:
        time.sleep(0.2)  # the writer's first send fills the buffers and comes back short
        while len(got) < len(data):
            chunk = peer.recv(1 << 16)
            if not chunk:
                return
            got.extend(chunk)

    reader = threading.Thread(target=read_slowly)
    reader.start()
    try:
        stream.write(data)
        stream.write(b"tail")
        reader.join(30)
        assert bytes(got[: len(data)]) == data
    finally:
        stream.close()
        peer.close()


def test_a_write_to_a_peer_that_never_reads_times_out_as_a_write_error(raw_pair: tuple[socket.socket, int]) -> None:
    srv, port = raw_pair
    stream = SocketBackend(write_timeout=0.5).connect(parse_uri(f"tcp://127.0.0.1:{port}"), 5)
    peer, _ = srv.accept()
    try:
        with pytest.raises(WriteError, match="peer not reading"):
            for _ in range(64):
                stream.write(b"x" * (1 << 20))
    finally:
        stream.close()
        peer.close()


def test_reads_map_data_silence_end_and_close(raw_pair: tuple[socket.socket, int]) -> None:
    srv, port = raw_pair
    stream = SocketBackend().connect(parse_uri(f"tcp://127.0.0.1:{port}"), 5)
    peer, _ = srv.accept()
    try:
        assert stream.read(100, 0.05) is None  # nothing yet
        peer.sendall(b"abc")
        assert stream.read(100, 5) == b"abc"
        errors: list[BaseException] = []

        def blocked_read() -> None:
            try:
                stream.read(100, None)
            except BaseException as exc:  # noqa: BLE001 - kept for the assertion
                errors.append(exc)

        reader = threading.Thread(target=blocked_read)
        reader.start()
        time.sleep(0.1)
        stream.close()  # wakes the reader
        reader.join(10)
        assert not reader.is_alive() and errors and isinstance(errors[0], ConnectionClosed)
        with pytest.raises(ConnectionClosed):
            stream.write(b"x")
    finally:
        peer.close()


# -- TLS ---------------------------------------------------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed (needed to make test certificates)")
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=amq test CA", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
    for name, san in (("server", "DNS:localhost"), ("client", "DNS:client")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={name}", cwd=d)
        (d / f"{name}.ext").write_text(f"subjectAltName={san}\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "other.key", "-out", "other.pem",
             "-days", "2", "-subj", "/CN=other CA", cwd=d)
    return d


def _server_context(pki: Path, require_client_cert: bool = False) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki / "server.pem", pki / "server.key")
    if require_client_cert:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(pki / "ca.pem")
    return ctx


def test_tls_verifies_the_server_against_ca_file(pki: Path) -> None:
    peer = ScriptedPeer(_server_context(pki))
    try:
        base = f"ssl://127.0.0.1:{peer.port}?caFile={pki / 'ca.pem'}"
        with amqtransport.connect(base + "&serverHostname=localhost") as conn:
            conn.send("/queue/tls", "secret")
            assert conn.connected_uri == f"ssl://127.0.0.1:{peer.port}"
        assert [f.body for f in peer.frames if f.command == "SEND"] == [b"secret"]
        with pytest.raises(ConnectError, match="TLS handshake failed"):
            amqtransport.connect(base)  # the certificate names localhost, not 127.0.0.1
        with pytest.raises(ConnectError, match="TLS handshake failed"):
            amqtransport.connect(f"ssl://127.0.0.1:{peer.port}?caFile={pki / 'other.pem'}&serverHostname=localhost")
        with amqtransport.connect(f"ssl://127.0.0.1:{peer.port}?verify=false") as conn:
            conn.send("/queue/tls", "unverified")
    finally:
        peer.close()


def test_tls_on_the_asyncio_client_verifies_as_the_sync_one(pki: Path) -> None:
    """The asyncio client builds its TLS context from the same URI options (caFile,
    serverHostname, verify) and fails a bad certificate with the same error (before,
    it ignored serverHostname: the first connect failed on the certificate's name)."""
    import asyncio

    import amqtransport.aio as aio

    peer = ScriptedPeer(_server_context(pki))

    async def send(uri: str, body: str) -> str | None:
        async with aio.connect(uri) as conn:
            await conn.send("/queue/tls", body)
            return conn.connected_uri

    try:
        base = f"ssl://127.0.0.1:{peer.port}?caFile={pki / 'ca.pem'}"
        assert asyncio.run(send(base + "&serverHostname=localhost", "async secret")) == f"ssl://127.0.0.1:{peer.port}"
        assert b"async secret" in [f.body for f in peer.frames if f.command == "SEND"]
        with pytest.raises(ConnectError, match="TLS handshake failed"):
            asyncio.run(send(base, "x"))  # the certificate names localhost, not 127.0.0.1
        with pytest.raises(ConnectError, match="TLS handshake failed"):
            asyncio.run(send(f"ssl://127.0.0.1:{peer.port}?caFile={pki / 'other.pem'}&serverHostname=localhost", "x"))
        asyncio.run(send(f"ssl://127.0.0.1:{peer.port}?verify=false", "unverified"))
    finally:
        peer.close()


def test_tls_client_certificate(pki: Path) -> None:
    peer = ScriptedPeer(_server_context(pki, require_client_cert=True))
    try:
        base = f"ssl://127.0.0.1:{peer.port}?caFile={pki / 'ca.pem'}&serverHostname=localhost"
        with amqtransport.connect(base + f"&certFile={pki / 'client.pem'}&keyFile={pki / 'client.key'}") as conn:
            conn.send("/queue/tls", "mutual")
        with pytest.raises(ConnectError):
            amqtransport.connect(base, connect_timeout=3)
        with pytest.raises(ConnectError, match="certFile|cert_file"):
            amqtransport.connect(base + f"&certFile={pki / 'missing.pem'}")
    finally:
        peer.close()


# -- fuzz: whatever the peer sends, the transport reports a TransportError or delivers frames


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(junk=st.binary(min_size=1, max_size=300))
def test_garbage_from_the_peer_never_crashes_the_reader(junk: bytes) -> None:
    backend = MemoryBackend()
    broker = backend.add("a:1")

    def after_connect(stream: MemoryStream, frame: Frame) -> bool:
        if frame.command == "CONNECT":
            stream.push(serialize(Frame.make("CONNECTED", {"version": "1.2"})) + junk)
            stream.hang_up()
            return True
        return False

    broker.on_frame = after_connect
    failed: list[BaseException] = []
    done = threading.Event()

    class L:
        def on_failed(self, error: BaseException) -> None:
            failed.append(error)
            done.set()

    conn = amqtransport.connect("tcp://a:1", backend=backend, listener=L())
    try:
        assert done.wait(5)
        assert len(failed) == 1 and isinstance(failed[0], TransportError)
    finally:
        conn.close()
