"""LazyFS models ``fallocate`` (mode 0), so a power loss exercises the journal's
preallocated segments (issue 27) as production writes them: through a real FUSE mount,
and with a real broker process whose data directory is on the mount.

An allocation is unsynced like a write (lost on power loss unless the file was
fsynced/fdatasynced); other modes are refused with EOPNOTSUPP. Before LazyFS had
``fallocate`` the kernel answered EOPNOTSUPP to every call and the broker's head grew as
it was written (its size after start: the 8-byte magic).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import struct
import threading
import time
import zlib
from pathlib import Path

import pytest

from amqtransport.client import connect
from amqtransport.errors import AmqTransportError
from amqtransport.testing.broker_process import BrokerProcess
from chaos.nemesis import lazyfs
from chaos.nemesis.lazyfs import LazyFs

pytestmark = [pytest.mark.chaos]

FUSE_REASON = lazyfs.unavailable_reason()
needs_fuse = pytest.mark.skipif(FUSE_REASON is not None, reason=f"LazyFS: {FUSE_REASON}")

FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 0x01, 0x02
SEGMENT = 256 * 1024
FRAME = struct.Struct("<II")


def _fallocate(fd: int, mode: int, offset: int, length: int) -> int:
    """The ``fallocate(2)`` system call itself (as the journal calls it: glibc's
    ``posix_fallocate`` would write zeros where it is not supported); 0 or the errno."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    fn = libc.fallocate
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    return 0 if fn(fd, mode, offset, length) == 0 else ctypes.get_errno()


@needs_fuse
@pytest.mark.timeout(120)
def test_an_allocation_is_unsynced_like_a_write_until_the_file_is_synced(tmp_path: Path) -> None:
    backing, mnt = tmp_path / "backing", tmp_path / "mnt"
    fs = LazyFs(backing, mnt, seed=5).start()
    try:
        fd = os.open(mnt / "synced", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, b"head", 0)
            assert _fallocate(fd, 0, 0, 65536) == 0  # before: EOPNOTSUPP
            assert os.fstat(fd).st_size == 65536
            assert os.pread(fd, 8, 0) == b"head" + bytes(4) and os.pread(fd, 16, 65520) == bytes(16)
            assert (backing / "synced").stat().st_size == 0  # not on the disk yet
            for mode in (FALLOC_FL_KEEP_SIZE, FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE):
                assert _fallocate(fd, mode, 0, 1 << 20) == errno.EOPNOTSUPP
            assert _fallocate(fd, 0, 65536, 4096) == 0  # mode 0 still works after a refused mode
            os.pwrite(fd, b"tail", 1000)
            os.fdatasync(fd)
            assert (backing / "synced").stat().st_size == 69632  # the allocation is durable with the data
        finally:
            os.close(fd)
        fd = os.open(mnt / "unsynced", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, b"data", 0)
            assert _fallocate(fd, 0, 0, 32768) == 0
            os.pwrite(fd, b"more", 20000)  # inside the allocation
            assert os.fstat(fd).st_size == 32768
        finally:
            os.close(fd)
        what = fs.power_loss(None)
        assert what == "lost 8 unsynced bytes in 1 file(s); 32764 bytes of unsynced allocation", what
        assert (mnt / "unsynced").stat().st_size == 0 and (mnt / "unsynced").read_bytes() == b""
        data = (mnt / "synced").read_bytes()
        assert len(data) == 69632 and data[:4] == b"head" and data[1000:1004] == b"tail"
        assert data[4:1000] == bytes(996) and data[1004:] == bytes(69632 - 1004)
    finally:
        fs.stop()


def _good_end(raw: bytes) -> int:
    """Where a segment's last whole, CRC-correct frame ends (after the 8-byte magic)."""
    pos = 8
    while pos + FRAME.size <= len(raw):
        length, crc = FRAME.unpack_from(raw, pos)
        body = raw[pos + FRAME.size:pos + FRAME.size + length]
        if length == 0 or len(body) < length or zlib.crc32(body) != crc:
            break
        pos += FRAME.size + length
    return pos


def _last_frame(raw: bytes, end: int) -> bytes:
    pos, last = 8, b""
    while pos < end:
        length, _ = FRAME.unpack_from(raw, pos)
        last = raw[pos:pos + FRAME.size + length]
        pos += FRAME.size + length
    return last


@needs_fuse
@pytest.mark.timeout(240)
def test_a_broker_on_lazyfs_preallocates_its_head_and_a_power_loss_keeps_every_receipted_message(
        tmp_path: Path) -> None:
    backing, mnt = tmp_path / "backing", tmp_path / "mnt"
    cfg = tmp_path / "broker.toml"
    cfg.write_text(f"segment_size = {SEGMENT}\n")
    fs = LazyFs(backing, mnt, seed=27).start()
    bp = BrokerProcess(mnt / "data", args=("--config", str(cfg)), log_dir=tmp_path / "logs")
    journal, on_disk = mnt / "data" / "journal", backing / "data" / "journal"
    try:
        bp.start()
        head = max(journal.glob("seg-*.log"))
        # the preallocation ran on LazyFS (before: 8, the magic, the head growing as written),
        # and is durable: the writer fdatasynced the new head
        assert head.stat().st_size == SEGMENT
        assert (on_disk / head.name).stat().st_size == SEGMENT
        conn = connect(bp.uri)
        with conn.producer(window=20) as p:
            for i in range(100):
                p.send("/queue/pl", f"r{i}")
        # then a stream of pipelined sends, the power lost while it writes
        streamed = conn.producer(window=16)
        stopped: list[BaseException] = []

        def stream() -> None:
            try:
                for i in range(100_000):
                    streamed.send("/queue/pl", f"s{i}", timeout=60)
            except (AmqTransportError, OSError) as exc:  # the broker's power went
                stopped.append(exc)

        sender = threading.Thread(target=stream, daemon=True)
        sender.start()
        deadline = time.monotonic() + 60
        while streamed.receipted < 50 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert streamed.receipted >= 50, stopped
        what = fs.power_loss(bp.pid, tear=True)
        bp.kill()  # reaps it
        sender.join(60)
        assert not sender.is_alive() and stopped, "the stream did not stop with the broker"
        receipted = {f"r{i}" for i in range(100)} | {f"s{i}" for i in range(streamed.receipted)}
        sent = {f"r{i}" for i in range(100)} | {f"s{i}" for i in range(streamed.sent)}
        with contextlib.suppress(AmqTransportError, OSError):
            conn.close()
        # the head keeps its preallocated size through the loss: the data ends at zeros
        head = max(journal.glob("seg-*.log"))
        raw = head.read_bytes()
        assert len(raw) == SEGMENT, what
        # and the next record torn: a strict prefix of it lands, zeros after it
        end = _good_end(raw)
        with open(head, "r+b") as f:
            f.seek(end)
            f.write(_last_frame(raw, end))
        torn = fs.power_loss(None, tear=True)
        assert "torn write" in torn and f"at offset {end}" in torn, torn
        assert head.stat().st_size == SEGMENT
        bp.start()  # recovery: the zero tail, the torn record cut
        got: list[str] = []
        with connect(bp.uri) as c:
            sub = c.subscribe("/queue/pl", ack="auto")
            while True:
                m = sub.receive(timeout=5)
                if m is None:
                    break
                got.append(m.text)
        assert receipted <= set(got), (sorted(receipted - set(got))[:5], what)
        assert set(got) <= sent and len(got) == len(set(got)), what
        new_head = max(journal.glob("seg-*.log"))
        assert new_head.name != head.name and new_head.stat().st_size == SEGMENT
        assert "Traceback" not in bp.log_text()
    finally:
        bp.close()
        fs.stop()
