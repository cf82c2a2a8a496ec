"""A full disk (and other journal I/O errors), for real: ``store_limit`` flow control
keeps it from filling, and when it fills anyway (ENOSPC) the sender gets an ERROR with
its ``receipt-id``, the broker fences itself (a standalone ``amq broker run`` exits 3,
an HA master hands over to its slave) and no receipted message is lost.

The full-disk tests mount a size-limited tmpfs (root only); they skip where that is
not allowed, with the reason."""

from __future__ import annotations

import contextlib
import resource
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from broker_helpers import Raw, StompPy

from amqtransport.broker import EmbeddedBroker
from amqtransport.processes.disk import TmpfsUnavailable, fill, resize, tmpfs
from amqtransport.stomp import Frame, serialize
from amqtransport.testing.broker_pair import BrokerPair
from amqtransport.testing.broker_process import BrokerProcess

pytestmark = pytest.mark.timeout(180)

KIB = 1024
MIB = 1024 * KIB
BODY = 100 * KIB


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[[int], Path]]:
    """Factory: a tmpfs of the given size under tmp_path, unmounted at teardown."""
    with contextlib.ExitStack() as stack:

        def make(size: int) -> Path:
            try:
                return stack.enter_context(tmpfs(tmp_path / f"disk{size}", size))
            except TmpfsUnavailable as exc:
                pytest.skip(f"full-disk test needs a tmpfs: {exc}")

        yield make


def config(tmp_path: Path, **keys: object) -> Path:
    path = tmp_path / "broker.toml"
    path.write_text("".join(f"{k} = {str(v).lower() if isinstance(v, bool) else v}\n" for k, v in keys.items()))
    return path


def send(seq: int, *, persistent: bool = True) -> bytes:
    """A receipted SEND of BODY bytes to /queue/full, receipt ``r<seq>``, header ``seq``."""
    headers = {"destination": "/queue/full", "persistent": str(persistent).lower(), "receipt": f"r{seq}", "seq": str(seq)}
    return serialize(Frame.make("SEND", headers, b"%08d" % seq * (BODY // 8)))


class Producer:
    """Receipted persistent SENDs on a raw connection, at most ``window`` unanswered,
    until the broker answers with ERRORs and closes it; records every RECEIPT and ERROR."""

    def __init__(self, port: int, count: int, *, first: int = 0, window: int = 4) -> None:
        self.raw = Raw(port)
        self.raw.connect()
        self.seqs = range(first, first + count)
        self.window = window
        self.receipted: set[int] = set()
        self.errors: list[Frame] = []
        self.sent = 0
        self.cond = threading.Condition()
        self.closed = threading.Event()
        threading.Thread(target=self._write, daemon=True).start()
        threading.Thread(target=self._read, daemon=True).start()

    def _write(self) -> None:
        with contextlib.suppress(OSError):
            for i in self.seqs:
                with self.cond:
                    self.cond.wait_for(
                        lambda: self.closed.is_set() or self.sent - len(self.receipted) - len(self.errors) < self.window
                    )
                if self.closed.is_set():
                    return
                self.raw.send_raw(send(i))
                self.sent += 1

    def _read(self) -> None:
        try:
            while True:
                f = self.raw.read(timeout=120)
                with self.cond:
                    if f.command == "RECEIPT":
                        self.receipted.add(int((f.get("receipt-id") or "r-1")[1:]))
                    elif f.command == "ERROR":
                        self.errors.append(f)
                    self.cond.notify_all()
        except (AssertionError, OSError):
            pass  # closed by the broker
        finally:
            self.closed.set()
            with self.cond:
                self.cond.notify_all()


def drain(port: int, at_least: int) -> list[int]:
    """The ``seq`` of every message in /queue/full (acked), until 1.5 s of quiet."""
    c = StompPy(port)
    c.conn.subscribe("/queue/full", id="1", ack="client-individual", headers={"activemq.prefetchSize": "50"})
    got: list[int] = []
    with contextlib.suppress(AssertionError):
        while True:
            m = c.get(timeout=60 if len(got) < at_least else 1.5)
            got.append(int(m.headers["seq"]))
            c.conn.ack(m.headers["ack"])
    c.close()
    return got


def check_errors(p: Producer, cause: str = "No space left on device") -> set[int]:
    """Every ERROR answers one SEND, never a receipted one, names the cause, and says
    either that its outcome is unknown (``amq-in-doubt``: the record was queued when the
    journal failed; it may have been dispatched already) or that it was not applied (a
    SEND that reached the broker after the failure, before the connection was closed: a
    race the test cannot rule out). Returns the seqs of those not applied."""
    assert p.errors, "the broker sent no ERROR"
    not_applied: set[int] = set()
    for e in p.errors:
        rid = e.get("receipt-id")
        assert rid is not None and rid.startswith("r"), e.headers
        assert int(rid[1:]) not in p.receipted, f"{rid} got both a RECEIPT and an ERROR"
        assert cause in (e.get("message") or ""), e.headers
        if e.get("amq-in-doubt") != "true":
            assert (e.get("message") or "").endswith("; not applied"), e.headers
            not_applied.add(int(rid[1:]))
    return not_applied


def test_a_full_disk_fails_the_sends_with_their_receipts_and_fences_the_broker(
    tmp_path: Path, small_disk: Callable[[int], Path]
) -> None:
    disk = small_disk(8 * MIB)
    cfg = config(tmp_path, segment_size=1 * MIB)
    with BrokerProcess(disk / "data", args=["--config", str(cfg)], log_dir=tmp_path) as bp:
        p = Producer(bp.port, 200)  # 20 MiB into 8 MiB
        assert p.closed.wait(60), "the broker never closed the producer's connection"
        not_applied = check_errors(p)
        assert bp.proc is not None and bp.proc.wait(30) == 3, bp.log_text()[-2000:]
        assert "No space left on device" in bp.log_text() and "fencing" in bp.log_text()
        assert 70 <= len(p.receipted) <= 82, len(p.receipted)  # about 8 MiB's worth
        resize(disk, 64 * MIB)  # the operator frees space and restarts the broker
        bp.start()
        got = drain(bp.port, len(p.receipted))
        assert p.receipted <= set(got), f"receipted but lost: {sorted(p.receipted - set(got))[:10]}"
        assert len(got) == len(set(got)) and set(got) <= set(range(p.sent))
        assert not not_applied & set(got), "an ERROR said 'not applied' but the message is there"
        # in doubt (an ERROR: written but maybe not synced) at most what the last batch held
        assert len(set(got) - p.receipted) <= len(p.errors)
        q = StompPy(bp.port)
        q.wait_receipts([q.send("/queue/full", "after", seq="-1")])  # serving again
        q.close()
        assert bp.terminate() == 0
        fill(disk)  # not a byte left for a new journal segment: a start says so and exits 1
        with pytest.raises(RuntimeError, match="exit code 1"):
            bp.start()
        assert "cannot open the journal" in bp.log_text() and "No space left on device" in bp.log_text()


def test_store_limit_flow_control_keeps_a_small_disk_from_filling(
    tmp_path: Path, small_disk: Callable[[int], Path]
) -> None:
    disk = small_disk(8 * MIB)
    cfg = config(tmp_path, segment_size=512 * KIB, store_limit=4 * MIB)
    with BrokerProcess(disk / "data", args=["--config", str(cfg)], log_dir=tmp_path) as bp:
        n = 120  # 12 MiB through an 8 MiB disk
        p = Producer(bp.port, n)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(p.receipted) < 35:
            time.sleep(0.05)
        time.sleep(1.0)
        held = len(p.receipted)
        assert 35 <= held <= 45, held  # about 4 MiB of journal, then producers wait
        assert not p.errors and not p.closed.is_set()
        assert "store limit reached" in bp.log_text()
        got = drain(bp.port, n)  # consuming frees segments; the producer goes on
        assert sorted(got) == list(range(n))
        assert p.receipted == set(range(n)) and not p.errors
        assert "No space left on device" not in bp.log_text()
        assert "producer flow control released" in bp.log_text()


def test_store_limit_with_send_fail_if_no_space(make_broker: Callable[..., EmbeddedBroker]) -> None:
    b = make_broker(store_limit=2 * MIB, segment_size=256 * KIB, send_fail_if_no_space=True, fsync=False)
    raw = Raw(b.port)
    raw.connect()
    for i in range(40):
        raw.send_raw(send(i, persistent=False))  # non-persistent messages never touch the store
        assert raw.read().get("receipt-id") == f"r{i}"
    for i in range(40, 100):
        raw.send_raw(send(i))
        f = raw.read()
        if f.command == "ERROR":
            break
    assert f.command == "ERROR" and f.get("receipt-id") == f"r{i}", f.headers
    assert "store_limit=2097152" in (f.get("message") or "")
    store = b.stats()["store"]
    assert isinstance(store, dict) and store["flow_control"] and store["size"] >= 2 * MIB
    assert 15 <= i - 40 <= 25  # about 2 MiB of persistent messages were accepted
    raw.close()
    np = Raw(b.port)
    np.connect()
    np.send_raw(send(999, persistent=False))  # still accepted while the store is full
    assert np.read().get("receipt-id") == "r999"
    np.close()


def test_an_ha_master_on_a_full_disk_hands_over_to_its_slave(
    tmp_path: Path, small_disk: Callable[[int], Path]
) -> None:
    disk = small_disk(8 * MIB)
    pair_dir = tmp_path / "pair"
    pair_dir.mkdir()
    with tmpfs_as(disk, pair_dir / "a"), BrokerPair("replicated", pair_dir, link_timeout=1.0) as pair:
        master = pair.wait_master()
        assert master is pair.a
        pair.wait_in_sync()
        before = StompPy(master.port)
        before.wait_receipts([before.send("/queue/full", f"{i}", seq=str(i)) for i in range(20)])
        before.close()
        filler = fill(disk)  # something else fills the master's disk
        p = Producer(master.port, 100, first=1000)
        assert p.closed.wait(60), "the master never closed the producer's connection"
        not_applied = check_errors(p)
        new = pair.wait_master(timeout=30, exclude=master)
        assert new is pair.b
        filler.unlink()  # space again: the old master resyncs from the new one as its slave
        assert pair.wait_in_sync(timeout=60) is pair.a
        receipted = {*range(20), *p.receipted}
        got = drain(new.port, len(receipted))
        assert receipted <= set(got), f"receipted but lost: {sorted(receipted - set(got))[:10]}"
        assert len(got) == len(set(got))
        assert not not_applied & set(got), "an ERROR said 'not applied' but the message is there"
        assert "handing over to the in-sync slave" in pair.a.log_text()


@contextlib.contextmanager
def tmpfs_as(disk: Path, path: Path) -> Iterator[None]:
    """Make ``path`` a directory on the tmpfs ``disk`` (a symlink: the pair finds it by name)."""
    (disk / path.name).mkdir()
    path.symlink_to(disk / path.name)
    yield


def test_a_journal_io_error_other_than_enospc_fences_the_same_way(tmp_path: Path) -> None:
    """Any write error fences: here EFBIG ('File too large'), from a file-size limit put
    on the running broker (RLIMIT_FSIZE; Python ignores SIGXFSZ, so write() fails)."""
    with BrokerProcess(tmp_path / "data", log_dir=tmp_path) as bp:
        resource.prlimit(bp.pid, resource.RLIMIT_FSIZE, (2 * MIB, resource.RLIM_INFINITY))
        p = Producer(bp.port, 100)
        assert p.closed.wait(60), "the broker never closed the producer's connection"
        # the same rule as ENOSPC: in doubt, or "not applied" for a SEND that reached the
        # broker after the failure (seen under load: a single "not applied" ERROR)
        not_applied = check_errors(p, "File too large")
        assert bp.proc is not None and bp.proc.wait(30) == 3
        assert 15 <= len(p.receipted) <= 21, len(p.receipted)  # about 2 MiB's worth
        bp.start()  # a new process: no file-size limit
        got = drain(bp.port, len(p.receipted))
        assert p.receipted <= set(got) and len(got) == len(set(got))
        assert not not_applied & set(got), "an ERROR said 'not applied' but the message is there"


def test_a_fenced_brokers_error_says_it_stopped(make_broker: Callable[..., EmbeddedBroker],
                                                caplog: pytest.LogCaptureFixture) -> None:
    """The ERROR a fenced broker sends its other clients carries ``amq-broker-stopped``,
    so a failover client does not take it for a refusal of its replay (which, twice,
    would drop its trackMessages cache: transports/core.py ``on_error``)."""
    from broker_helpers import Raw

    b = make_broker()
    c = Raw(b.port)
    assert c.connect().command == "CONNECTED"
    b.call(lambda: b.server.fence("journal failed: test"))
    err = c.read()
    assert err.command == "ERROR" and err.get("amq-broker-stopped") == "true", err.headers
    assert "broker stopped accepting messages: journal failed: test" in (err.get("message") or "")
    caplog.clear()  # the fence's own ERROR log line is the point here, not a broker fault
