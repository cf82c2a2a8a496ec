"""Preallocated journal segments (issue 27): the head segment is created at its full
``segment_size`` and written at its offsets, so that an append's ``fdatasync`` never
changes the file's size; its data ends at a zero frame head with only zeros after it
(the format, :mod:`amqtransport.broker.store.segments`).

The crash images below are copies of a live journal's directory (what a SIGKILL or a
power loss after the last fsync leaves): records, then the preallocated zeros."""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import shutil
import threading
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_store import msg, open_store

from amqtransport.broker.store import files
from amqtransport.broker.store.chain import read_chain
from amqtransport.broker.store.checkpoint_file import CheckpointProvesLoss, load
from amqtransport.broker.store.journal import Journal, JournalError
from amqtransport.broker.store.pages import pack
from amqtransport.broker.store.records import Ack, encode
from amqtransport.broker.store.salvage import Damage, TornTail, ZeroTail, scan_with_damage, verify
from amqtransport.broker.store.segments import FRAME, MAGIC, Scan, segment_name
from amqtransport.processes.disk import TmpfsUnavailable, tmpfs

SEG = 64 * 1024
N = 20


def rec(i: int) -> bytes:
    return encode(Ack((f"ID:m-{i}",), "/queue/a"))


def frames(payloads: list[bytes]) -> bytes:
    return b"".join(FRAME.pack(len(p), zlib.crc32(p)) + p for p in payloads)


def crash_image(tmp_path: Path, n: int = N) -> tuple[Path, list[int]]:
    """A journal with ``n`` records fsynced in its (preallocated) head, copied while it
    is open: no cut at close. Returns the copy and the records' offsets."""
    live, image = tmp_path / "live", tmp_path / "image"
    j = Journal(live, segment_size=SEG)
    j.start()
    offsets = [j.append_at([rec(i)])[1] for i in range(n)]
    assert j.flush(timeout=30)
    shutil.copytree(live, image)
    j.close()
    return image, offsets


def recovered(directory: Path) -> tuple[Journal, list[bytes]]:
    j = Journal(directory, segment_size=SEG)
    got = [encode(r) for _seg, r in j.recover()]
    return j, got


def test_the_head_is_preallocated_and_an_append_does_not_change_its_size(tmp_path: Path) -> None:
    """Before: the head grew with every append (an fdatasync that commits the inode)."""
    j = Journal(tmp_path / "j", segment_size=SEG)
    j.start()
    head = j.path_of(j.head)
    try:
        assert head.stat().st_size == SEG
        j.append([rec(1)])
        assert j.flush(timeout=30)
        assert head.stat().st_size == SEG
        assert j.segment_sizes()[j.head] == len(MAGIC) + FRAME.size + len(rec(1))  # the written size
        assert head.read_bytes()[len(MAGIC) :].rstrip(b"\0") == frames([rec(1)]).rstrip(b"\0")
    finally:
        j.close()
    assert head.stat().st_size == len(MAGIC) + FRAME.size + len(rec(1))  # closed: cut to its data


def test_a_rolled_segment_is_cut_to_its_written_size_and_read_back(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j", segment_size=4096)
    j.start()
    first = j.head
    big = [encode(Ack((f"ID:{'x' * 300}-{i}",), "/queue/a")) for i in range(30)]
    at = [j.append_at([p]) for p in big]
    assert j.flush(timeout=30)
    try:
        assert j.head > first
        sizes = j.segment_sizes()
        assert j.path_of(first).stat().st_size == sizes[first] < 4096
        assert j.path_of(j.head).stat().st_size == 4096
        # a replica's full sync reads whole frames, as far as written, across the roll
        payloads, _seg, _off, caught_up = j.read_span(first, len(MAGIC), 1 << 20)
        assert payloads == big and caught_up
        assert j.read([pack(seg, off) for seg, off in at]) == big
    finally:
        j.close()


def test_a_crash_image_records_then_zeros_recovers_every_record_and_no_damage(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: the zeros after the records were an undecodable frame: a torn tail cut
    with a warning (and in a segment that was not the last: damage)."""
    image, _ = crash_image(tmp_path)
    seg = sorted(image.glob("seg-*.log"))[-1]
    assert seg.stat().st_size == SEG
    report = verify(image)
    assert report.ok and report.segments[-1].size == len(MAGIC) + len(frames([rec(i) for i in range(N)]))
    assert report.segments[-1].unwritten == SEG - report.segments[-1].size and report.segments[-1].torn_tail is None
    assert "bytes preallocated after them" in "\n".join(report.lines())
    caplog.set_level(logging.WARNING)
    j, got = recovered(image)
    try:
        assert got == [rec(i) for i in range(N)] and j.damage == []
        assert "torn tail" not in caplog.text
        assert seg.stat().st_size == report.segments[-1].size  # the old head is done: its zeros are cut
        assert j.segment_sizes()[int(seg.name[4:-4])] == report.segments[-1].size
        j.start()
        assert j.path_of(j.head).stat().st_size == SEG  # the new head has its own preallocation
    finally:
        j.close()


def test_a_torn_record_followed_by_zeros_is_a_torn_tail_cut_and_earlier_records_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    image, offsets = crash_image(tmp_path)
    seg = sorted(image.glob("seg-*.log"))[-1]
    assert seg.stat().st_size == SEG
    end = offsets[-1] + FRAME.size + len(rec(N - 1))
    torn = (FRAME.pack(len(rec(99)), zlib.crc32(rec(99))) + rec(99))[:-5]  # its last bytes never landed
    with open(seg, "r+b") as fh:
        fh.seek(end)
        fh.write(torn)
    assert verify(image).segments[-1].torn_tail is not None
    caplog.set_level(logging.WARNING)
    j, got = recovered(image)
    try:
        assert got == [rec(i) for i in range(N)] and j.damage == []
        assert "torn tail" in caplog.text
        assert seg.stat().st_size == end  # cut where the torn record starts, zeros and all
    finally:
        j.close()


def test_a_flipped_bit_mid_segment_is_damage_and_the_records_after_it_are_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    image, offsets = crash_image(tmp_path)
    seg = sorted(image.glob("seg-*.log"))[-1]
    assert seg.stat().st_size == SEG
    raw = bytearray(seg.read_bytes())
    raw[offsets[10] + FRAME.size + 3] ^= 0x04
    seg.write_bytes(bytes(raw))
    report = verify(image)
    (damage,) = report.segments[-1].damage
    assert (damage.offset, damage.end) == (offsets[10], offsets[11]) and "checksum mismatch" in damage.problem
    j, got = recovered(image)
    try:
        assert got == [rec(i) for i in range(N) if i != 10]
        assert [(d.offset, d.end) for d in j.damage] == [(offsets[10], offsets[11])]
        assert "bytes skipped" in caplog.text
        caplog.clear()  # (the damage is logged at ERROR, as it must be)
    finally:
        j.close()


def test_a_finished_segment_a_crash_left_with_its_zero_tail_is_no_damage(tmp_path: Path) -> None:
    """The writer cuts a segment when it rolls past it; a crash before that cut reached
    the disk leaves zeros after its data, and it is no longer the last segment. Before:
    damage (nothing intact after the bad frame, in a segment that is not the last)."""
    d = tmp_path / "j"
    d.mkdir()
    (d / segment_name(1)).write_bytes(MAGIC + frames([rec(1), rec(2)]) + bytes(5000))
    (d / segment_name(2)).write_bytes(MAGIC + frames([rec(3)]))
    assert verify(d).ok
    j, got = recovered(d)
    try:
        assert got == [rec(1), rec(2), rec(3)] and j.damage == []
        assert (d / segment_name(1)).stat().st_size == len(MAGIC) + len(frames([rec(1), rec(2)]))
    finally:
        j.close()


def test_a_segment_written_the_old_way_opens_unchanged(tmp_path: Path) -> None:
    """A store from before preallocation: segments end at their file's end."""
    d = tmp_path / "j"
    d.mkdir()
    old = [MAGIC + frames([rec(1), rec(2)]), MAGIC + frames([rec(3)])]
    for i, data in enumerate(old, 1):
        (d / segment_name(i)).write_bytes(data)
    j, got = recovered(d)
    try:
        assert got == [rec(1), rec(2), rec(3)] and j.damage == []
        assert [(d / segment_name(i)).read_bytes() for i in (1, 2)] == old  # nothing cut, nothing added
        j.start()
        j.append([rec(4)])
        assert j.flush(timeout=30)
        assert j.path_of(j.head).stat().st_size == SEG
    finally:
        j.close()
    j, got = recovered(d)
    j.close()
    assert got == [rec(i) for i in range(1, 5)]


def test_a_zero_frame_head_with_data_after_it_is_a_bad_frame() -> None:
    """crc32(b"") == 0: a naive check would read the zero head as an empty record."""
    view = memoryview(MAGIC + frames([rec(1)]) + bytes(FRAME.size) + b"\x01" + bytes(100))
    scan = Scan(view, len(MAGIC), 1 << 20)
    assert [p.tobytes() for _o, p, _r in scan] == [rec(1)]
    assert scan.problem is not None and "empty frame" in scan.problem and not scan.zero_tail
    items = list(scan_with_damage(view, 1, len(MAGIC), 1 << 20, last=True))
    assert isinstance(items[-1], TornTail)  # nothing intact after it, last segment: torn
    items = list(scan_with_damage(view, 1, len(MAGIC), 1 << 20, last=False))
    assert isinstance(items[-1], Damage)
    # an intact frame after the zero head: damage, and the frame after it is read
    view = memoryview(MAGIC + frames([rec(1)]) + bytes(FRAME.size + 3) + frames([rec(2)]) + bytes(64))
    items = list(scan_with_damage(view, 1, len(MAGIC), 1 << 20, last=True))
    assert [i[1].tobytes() for i in items if isinstance(i, tuple)] == [rec(1), rec(2)]
    assert sum(isinstance(i, Damage) for i in items) == 1 and isinstance(items[-1], ZeroTail)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=10**6), max_size=30), st.binary(max_size=300),
       st.integers(min_value=0, max_value=5000), st.booleans())
def test_scan_with_a_zero_tail_reads_every_frame_before_it_and_accounts_for_every_byte(
    ids: list[int], junk: bytes, zeros: int, last: bool
) -> None:
    payloads = [rec(i) for i in ids]
    data = MAGIC + frames(payloads)
    view = memoryview(data + junk + bytes(zeros))
    items = list(scan_with_damage(view, 1, len(MAGIC), 1 << 20, last=last))
    read = [i[1].tobytes() for i in items if isinstance(i, tuple)]
    assert read[: len(payloads)] == payloads  # nothing before the junk is lost
    at = len(MAGIC)
    for item in items:  # every byte is a frame, damage, a torn tail or the zero tail, in order
        if isinstance(item, tuple):
            assert item[0] == at
            at += FRAME.size + len(item[1])
        elif isinstance(item, Damage):
            assert item.offset == at < item.end
            at = item.end
        else:
            assert isinstance(item, TornTail | ZeroTail) and item.offset == at
            assert isinstance(item, ZeroTail) or last
            if isinstance(item, ZeroTail):
                assert not bytes(view[at:]).strip(b"\0") and at < len(view)
            at = len(view)
    assert at == len(view)
    if not junk.strip(b"\0"):  # records then zeros only: a clean end, never damage or a torn tail
        assert read == payloads and not any(isinstance(i, Damage | TornTail) for i in items)


def test_a_checkpoint_whose_preallocated_segment_lost_its_data_proves_loss(tmp_path: Path) -> None:
    """What a power loss takes from a preallocated head reads back as zeros, not as a
    shorter file. Before: the file was long enough, so nothing was proved lost (the
    checkpoint was only refused and the journal replayed without the records)."""
    live, image = tmp_path / "live", tmp_path / "image"
    s = open_store(live, checkpoints=True)
    for i in range(5):
        s.add(msg(i))
    s.checkpoints.write_now()
    shutil.copytree(live, image)
    s.close()
    seg = sorted(image.glob("seg-*.log"))[-1]
    assert seg.stat().st_size > len(seg.read_bytes().rstrip(b"\0")) + 1000  # preallocated
    ids = [int(p.name[4:-4]) for p in sorted(image.glob("seg-*.log"))]
    load(image, ids, read_chain(image))  # the image is whole: the checkpoint is usable
    data = bytearray(seg.read_bytes())
    written = len(data.rstrip(b"\0"))
    data[written - 60 :] = bytes(len(data) - written + 60)  # the last record's tail lost
    seg.write_bytes(bytes(data))
    with pytest.raises(CheckpointProvesLoss, match="cut short"):
        load(image, ids, read_chain(image))


def _no_fallocate(err: int) -> Callable[[], Callable[[int, int, int, int], int]]:
    def call() -> Callable[[int, int, int, int], int]:
        def fail(fd: int, mode: int, offset: int, length: int) -> int:
            ctypes.set_errno(err)
            return -1
        return fail
    return call


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EOPNOTSUPP])
def test_when_preallocation_fails_the_head_grows_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int
) -> None:
    monkeypatch.setattr(files, "_fallocate_call", _no_fallocate(err))
    j = Journal(tmp_path / "j", segment_size=SEG)
    j.start()
    head = j.path_of(j.head)
    try:
        assert head.stat().st_size == len(MAGIC)
        j.append([rec(1)])
        assert j.flush(timeout=30)
        assert head.read_bytes() == MAGIC + frames([rec(1)])
    finally:
        j.close()
    j, got = recovered(tmp_path / "j")
    j.close()
    assert got == [rec(1)]


def test_on_a_disk_too_small_for_the_preallocation_the_journal_grows_until_full(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A real full disk (tmpfs): fallocate fails with ENOSPC, the head grows as written,
    and a write the disk cannot take fails the journal (no durability claimed)."""
    try:
        cm = tmpfs(tmp_path / "disk", 256 * 1024)
        disk = cm.__enter__()
    except TmpfsUnavailable as exc:
        pytest.skip(f"needs a tmpfs: {exc}")
    try:
        j = Journal(disk / "j", segment_size=1 << 20)  # more than the disk holds
        j.start()
        head = j.path_of(j.head)
        assert head.stat().st_size == len(MAGIC)  # not preallocated
        big = encode(Ack((f"ID:{'y' * 4000}",), "/queue/a"))
        errors: list[BaseException | None] = []
        for _ in range(200):
            j.append([big], errors.append)
            if not j.flush(timeout=30):
                break
        assert j.failed is not None and "No space left" in str(j.failed.__cause__ or j.failed)
        assert errors[-1] is not None and all(e is None for e in errors[:-1])
        j.close()
        j2, got = recovered(disk / "j")
        j2.close()
        assert got == [big] * (len(errors) - 1)  # every record acknowledged is there
        assert "No space left" in caplog.text
        caplog.clear()  # (the failed write is logged at ERROR, as it must be)
    finally:
        cm.__exit__(None, None, None)


def test_a_commit_reads_no_attribute_of_the_head_and_a_deleted_head_still_fails_the_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Since Linux 6.13 a stat that reads a file's ctime makes its next write take a
    fine-grained timestamp, which dirties the inode: the guard's fstat of the head after
    every batch cost the next fdatasync 40-50 us, all that preallocation saves (issue 27,
    measured: 125-136 us against 86-90). Before: ``StorageGuard.quick`` fstat'ed it."""
    j = Journal(tmp_path / "j", segment_size=SEG)
    j.start()
    j.wake_on_append = False
    head_ino = j.path_of(j.head).stat().st_ino
    statted: list[int] = []
    real_fstat = os.fstat

    def fstat(fd: int) -> os.stat_result:
        st = real_fstat(fd)
        if st.st_ino == head_ino:
            statted.append(fd)
        return st

    monkeypatch.setattr(os, "fstat", fstat)
    try:
        for i in range(5):
            j.append([rec(i)])
            assert j.commit_here(4) is not None
        assert statted == []
        j.path_of(j.head).unlink()  # no receipt into a deleted file: the guard still sees it
        errors: list[BaseException | None] = []
        j.append([rec(9)], errors.append)
        assert j.commit_here(4) is not None
        assert len(errors) == 1 and errors[0] is not None and "was deleted" in str(errors[0])
        caplog.clear()  # (the failure is logged at ERROR, as it must be)
    finally:
        monkeypatch.undo()
        j.close()


def test_disarm_copies_a_preallocated_head_whole_and_its_zeros_as_holes(tmp_path: Path) -> None:
    """A witness-sealed shared store's new master copies the newest segment over itself
    (``ha.sealed.disarm``): the copy reads the same, and the preallocated zeros cost it no
    write (before: every zero byte written, 32 MiB for a fresh default head)."""
    from amqtransport.broker.ha.sealed import disarm

    size = 8 << 20
    j = Journal(tmp_path / "journal", segment_size=size)
    j.start()
    for i in range(N):
        j.append([rec(i)])
    assert j.flush(timeout=30)
    head = j.path_of(j.head)
    before = head.read_bytes()
    assert len(before) == size
    disarm(tmp_path / "journal", fsync=False)
    after = head.stat()
    assert head.read_bytes() == before
    assert after.st_blocks * 512 < size // 4  # the zeros are holes
    j.close()


def test_a_batch_appended_alone_gets_a_segment_of_its_own(tmp_path: Path) -> None:
    """``append_at(alone=True)`` (compaction's carried keys): the head rolls before the
    batch when it holds records, and after it; an empty head takes it as it is. Recovery
    reads every record back, in order, from the segments they were put in."""
    j = Journal(tmp_path / "j", segment_size=SEG)
    j.start()
    try:
        start = j.head
        empty, _ = j.append_at([rec(0)], alone=True)  # the new head is empty: no roll
        first, _ = j.append_at([rec(1)])  # after a batch alone: a roll
        alone, _ = j.append_at([rec(2), rec(3)], alone=True)
        after, _ = j.append_at([rec(4)])
        assert (empty, first, alone, after) == (start, start + 1, start + 2, start + 3)
        assert j.flush(timeout=30)
    finally:
        j.close()
    j2 = Journal(tmp_path / "j", segment_size=SEG)
    got = [(seg, encode(r)) for seg, r in j2.recover()]
    assert got == [(empty, rec(0)), (first, rec(1)), (alone, rec(2)), (alone, rec(3)), (after, rec(4))]
    j2.close()


def test_a_read_of_positions_some_not_written_yet_waits_for_the_last_one(tmp_path: Path) -> None:
    """``read`` reads a run of positions with one ``pread``: it must wait until the *last*
    of them is written, not only the first. Before, a position queued but not written yet
    read the preallocated zeros as a frame of length 0 (``crc32(b"") == 0``), and came back
    as an empty payload: a replica's full sync then failed on it (``IndexError`` in the
    master's sync pump, the link stalled for good: a thawed master resyncing from its
    successor held every receipt of the pair)."""
    j = Journal(tmp_path / "j", segment_size=SEG)
    j.start()
    release = threading.Event()
    hooked = threading.Event()

    def stall(payloads: list[bytes]) -> None:  # the writer stops after writing batch B
        if payloads == [rec(2)]:
            hooked.set()
            assert release.wait(30)

    try:
        a = j.append_at([rec(1)])
        assert j.flush(timeout=30)
        j.add_batch_hook(stall)  # type: ignore[arg-type]
        j.append([rec(2)])
        assert hooked.wait(30)
        c = j.append_at([rec(3)])  # queued: the writer is stuck in B's hook
        threading.Timer(0.3, release.set).start()
        assert j.read([pack(*a), pack(*c)]) == [rec(1), rec(3)]
    finally:
        release.set()
        j.close()


def test_a_zero_frame_head_is_no_record(tmp_path: Path) -> None:
    """A record whose bytes were zeroed on disk (a lost write) reads as an error, not as an
    empty record: no record has length 0, though ``crc32(b"") == 0`` would pass it."""
    j = Journal(tmp_path / "j", segment_size=SEG)
    j.start()
    try:
        at = j.append_at([rec(1)])
        j.append([rec(2)])
        assert j.flush(timeout=30)
        fd = os.open(j.path_of(at[0]), os.O_WRONLY)
        try:
            os.pwrite(fd, bytes(FRAME.size + len(rec(1))), at[1])
        finally:
            os.close(fd)
        with pytest.raises(JournalError, match="no record"):
            j.read([pack(*at)])
    finally:
        j.close()
