"""Many connections (issue 12, item 4): ``max_connections`` is a cap with a clear
refusal, and ``amq broker run`` raises its open-file limit so that the cap, not the
operating system's default of 1024 files, is what limits clients."""

from __future__ import annotations

import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from amqtransport.broker import BrokerConfig, EmbeddedBroker
from amqtransport.stomp import Frame, FrameParser
from amqtransport.testing.broker_process import BrokerProcess

from .scale_helpers import Raw

resource = pytest.importorskip("resource", reason="open-file limits are POSIX")


@pytest.fixture
def capped(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    b = EmbeddedBroker(port=0, data_dir=tmp_path / "d", config=BrokerConfig(max_connections=3, fsync=False)).start()
    yield b
    b.stop()


def first_frame(port: int) -> Frame:
    """Connect, send CONNECT, return the broker's first frame."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"CONNECT\naccept-version:1.2\nhost:x\n\n\x00")
        parser = FrameParser("1.2")
        while True:
            data = sock.recv(65536)
            assert data, "closed without a frame"
            parser.feed(data)
            frames = [e for e in parser.events() if isinstance(e, Frame)]
            if frames:
                return frames[0]


def test_a_connection_over_max_connections_is_refused_with_the_reason(capped: EmbeddedBroker) -> None:
    clients = [Raw(capped.port) for _ in range(3)]
    refused = first_frame(capped.port)
    assert refused.command == "ERROR"
    assert "too many connections" in (refused.get("message") or "")
    assert "max_connections=3" in (refused.get("message") or "")
    clients[0].receipt("SEND", {"destination": "/queue/a"}, b"still served")  # the others are untouched
    clients.pop().close()
    assert first_frame(capped.port).command == "CONNECTED"  # a freed place is taken again
    for c in clients:
        c.close()


class Limited(BrokerProcess):
    """``amq broker run`` started under other open-file limits (``prlimit``)."""

    def __init__(self, data_dir: Path, config: Path, *, nofile: str) -> None:
        super().__init__(data_dir / "d", args=["--config", str(config)], log_dir=data_dir)
        self.nofile = nofile

    def command(self) -> list[str]:
        return ["prlimit", f"--nofile={self.nofile}", "--", *super().command()]


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux) to start a broker under a limit")
def test_amq_broker_run_raises_its_open_file_limit_for_max_connections(tmp_path: Path) -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 3256:
        pytest.skip(f"the hard open-file limit here is {hard}, below the 3256 this test asks for")
    cfg = tmp_path / "broker.toml"
    cfg.write_text("max_connections = 3000\n")
    bp = Limited(tmp_path, cfg, nofile="512:3300").start()
    try:
        limits = Path(f"/proc/{bp.pid}/limits").read_text()
        line = next(ln for ln in limits.splitlines() if ln.startswith("Max open files"))
        assert line.split()[3:5] == ["3256", "3300"], line
        assert "open-file limit raised from 512 to 3256 for max_connections=3000" in bp.log_text()
    finally:
        bp.terminate()


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux) to start a broker under a limit")
def test_a_hard_limit_below_max_connections_is_said_in_the_log(tmp_path: Path) -> None:
    cfg = tmp_path / "broker.toml"
    cfg.write_text("max_connections = 5000\n")
    bp = Limited(tmp_path, cfg, nofile="400:600").start()
    try:
        log = bp.log_text()
        assert "open-file limit raised from 400 to 600" in log
        assert "open-file limit is 600: about 344 clients can connect, fewer than max_connections=5000" in log
    finally:
        bp.terminate()
