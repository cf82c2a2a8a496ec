"""The pure parts of the nemesis's new faults: the link model (cuts -> nft rules), the
availability figures, LazyFS's overlay (unsynced writes lost on power loss) and the
bit-flip of a finished journal segment. No broker, no namespace, no FUSE mount here
(tests/chaos/test_nemesis_faults.py does those with the real kernel)."""

from __future__ import annotations

import random
import time
import zlib
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqtransport.broker.store.records import Ack, encode
from amqtransport.broker.store.salvage import verify
from amqtransport.broker.store.segments import FRAME, MAGIC, segment_name
from chaos.nemesis.availability import AFTER_S, availability
from chaos.nemesis.bitflip import finished_segments, flip_bit
from chaos.nemesis.checker import check
from chaos.nemesis.faults import Nemesis
from chaos.nemesis.history import Fault, History, RoundRecord, Send
from chaos.nemesis.lazyfs import Overlay
from chaos.nemesis.netns import (
    CLIENTS,
    TABLE,
    isolate,
    nft_script,
    one_way,
    partition,
    plan_endpoints,
)

pytestmark = pytest.mark.chaos

EP = plan_endpoints("t", "10.9.9", ["a", "b"], {"a": 6001, "b": 6002}, {"a": 7001, "b": 7002})


# -- the link model ------------------------------------------------------------------------


def test_endpoints_clients_are_ours_nodes_in_their_namespaces() -> None:
    assert EP[CLIENTS].ns is None and EP[CLIENTS].ip == "10.9.9.1"
    assert (EP["a"].ns, EP["a"].ip, EP["b"].ns, EP["b"].ip) == ("t-a", "10.9.9.2", "t-b", "10.9.9.3")
    # a third endpoint (the witness) is one more name
    three = plan_endpoints("t", "10.9.9", ["a", "b", "witness"], {})
    assert three["witness"].ns == "t-witness" and three["witness"].ip == "10.9.9.4"
    assert isolate("witness", three) == {("witness", x, "all") for x in ("a", "b", CLIENTS)} | {
        (x, "witness", "all") for x in ("a", "b", CLIENTS)}


def test_the_witness_is_cut_from_a_node_in_both_namespaces_and_an_isolated_node_loses_it_too() -> None:
    """partition-witness and isolate-node with a witness (chaos/nemesis/faults.py): the
    node <-> witness link is cut in each sender's namespace, everything, not a port."""
    ep = plan_endpoints("t", "10.9.9", ["a", "b", "witness"], {"a": 6001, "b": 6002, "witness": 6003},
                        {"a": 7001, "b": 7002})
    scripts = nft_script(dict.fromkeys(partition("a", "witness"), "drop"), ep)
    assert scripts["t-a"].splitlines()[2:] == [f"add rule inet {TABLE} output ip daddr 10.9.9.4 drop"]
    assert scripts["t-witness"].splitlines()[2:] == [f"add rule inet {TABLE} output ip daddr 10.9.9.2 drop"]
    assert scripts["t-b"].splitlines()[2:] == []
    rules = nft_script(dict.fromkeys(isolate("a", ep), "drop"), ep)["t-a"].splitlines()[2:]
    assert f"add rule inet {TABLE} output ip daddr 10.9.9.4 drop" in rules
    assert f"add rule inet {TABLE} output ip daddr 10.9.9.3 drop" in rules


def test_no_cut_flushes_every_namespace() -> None:
    scripts = nft_script({}, EP)
    assert set(scripts) == {"t-a", "t-b"}
    for s in scripts.values():
        assert s.splitlines() == [f"flush chain inet {TABLE} input", f"flush chain inet {TABLE} output"]


def test_a_node_partition_drops_both_ways_each_in_the_senders_namespace() -> None:
    scripts = nft_script(dict.fromkeys(partition("a", "b"), "drop"), EP)
    assert scripts["t-a"].splitlines()[2:] == [f"add rule inet {TABLE} output ip daddr 10.9.9.3 drop"]
    assert scripts["t-b"].splitlines()[2:] == [f"add rule inet {TABLE} output ip daddr 10.9.9.2 drop"]


def test_a_one_way_cut_is_one_rule() -> None:
    scripts = nft_script(dict.fromkeys(one_way("b", "a"), "drop"), EP)
    assert scripts["t-b"].splitlines()[2:] == [f"add rule inet {TABLE} output ip daddr 10.9.9.2 drop"]
    assert scripts["t-a"].splitlines()[2:] == []


def test_a_client_cut_covers_the_client_port_and_never_touches_our_namespace() -> None:
    scripts = nft_script(dict.fromkeys(partition(CLIENTS, "a"), "drop"), EP)
    assert scripts["t-a"].splitlines()[2:] == [
        f"add rule inet {TABLE} output ip daddr 10.9.9.1 tcp sport 6001 drop",
        f"add rule inet {TABLE} input ip saddr 10.9.9.1 tcp dport 6001 drop",
    ]
    assert None not in scripts


def test_a_client_cut_covers_the_relay_port_too() -> None:
    """A node run with --relay-port: a client partition cuts the clients from both of its ports."""
    ep = plan_endpoints("t", "10.9.9", ["a", "b"], {"a": 6001, "b": 6002}, {"a": 7001, "b": 7002},
                        {"a": 8001, "b": 8002})
    scripts = nft_script(dict.fromkeys(partition(CLIENTS, "a"), "drop"), ep)
    assert scripts["t-a"].splitlines()[2:] == [
        f"add rule inet {TABLE} output ip daddr 10.9.9.1 tcp sport {{ 6001, 8001 }} drop",
        f"add rule inet {TABLE} input ip saddr 10.9.9.1 tcp dport {{ 6001, 8001 }} drop",
    ]
    # between the nodes nothing changes: the HA ports, or everything
    assert nft_script(dict.fromkeys(partition("a", "b", "ha"), "drop"), ep) == \
        nft_script(dict.fromkeys(partition("a", "b", "ha"), "drop"), EP)


def test_a_replication_cut_covers_the_ha_ports_and_reject_resets() -> None:
    scripts = nft_script(dict.fromkeys(partition("a", "b", "ha"), "reject"), EP)
    assert scripts["t-a"].splitlines()[2:] == [
        f"add rule inet {TABLE} output ip daddr 10.9.9.3 tcp dport 7002 meta l4proto tcp reject with tcp reset",
        f"add rule inet {TABLE} output ip daddr 10.9.9.3 tcp sport 7001 meta l4proto tcp reject with tcp reset",
    ]


def test_isolating_a_node_cuts_it_from_everyone() -> None:
    cuts = isolate("a", EP)
    assert cuts == {("a", "b", "all"), ("b", "a", "all"), ("a", CLIENTS, "all"), (CLIENTS, "a", "all")}
    scripts = nft_script(dict.fromkeys(cuts, "drop"), EP)
    assert len(scripts["t-a"].splitlines()[2:]) == 3 and len(scripts["t-b"].splitlines()[2:]) == 1


def test_bad_cuts_are_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="unknown endpoint"):
        nft_script({("a", "witness", "all"): "drop"}, EP)
    with pytest.raises(ValueError, match="to itself"):
        nft_script({("a", "a", "all"): "drop"}, EP)
    with pytest.raises(ValueError, match="action"):
        nft_script({("a", "b", "all"): "explode"}, EP)
    with pytest.raises(ValueError, match="service"):
        nft_script({("a", "b", "smtp"): "drop"}, EP)
    with pytest.raises(ValueError, match="client port"):
        nft_script({(CLIENTS, "a", "ha"): "drop"}, EP)


# -- availability ---------------------------------------------------------------------------


def _history(sends: list[float], faults: list[Fault], rounds: tuple[float, float] = (0.0, 40.0),
             mode: str = "replicated") -> History:
    h = History({"link_timeout_s": 1.0})
    h.add(RoundRecord(1, 1, mode, rounds[0], rounds[1], "", True, 0.0))
    h.extend(Send(t - 0.01, "p-indiv", "/queue/x", f"k{i}", "rcpt", "ok", t) for i, t in enumerate(sends))
    h.extend(faults)
    return h


def test_an_instant_fault_is_observed_after_the_link_timeout_for_four_windows() -> None:
    kill = Fault(10.0, 10.0, 1, "kill-master", "a", "SIGKILL pid 1")
    # receipts at 10.5 (inside the excluded link timeout), none in [11, 13), then 13.2 and 14.5
    figures = availability(_history([10.5, 13.2, 14.5], [kill]))
    a = figures["kill-master"]
    assert (a.windows, a.available) == (4, 2)  # [11,12) [12,13) [13,14) [14,15)
    assert a.share == 0.5
    assert figures["all-faults"].windows == 4


def test_a_held_fault_is_observed_while_it_holds_and_five_seconds_after() -> None:
    cut = Fault(20.0, 23.0, 1, "partition-clients", "a", "kernel drop")
    a = availability(_history([float(t) + 0.5 for t in range(40)], [cut]))["partition-clients"]
    assert a.windows == int(23.0 + AFTER_S - 21.0) and a.available == a.windows


def test_skipped_faults_count_for_nothing_and_the_baseline_excludes_fault_time() -> None:
    skipped = Fault(5.0, 5.0, 1, "power-loss", "-", "skipped: no LazyFS")
    kill = Fault(10.0, 10.0, 1, "kill-master", "a", "SIGKILL")
    figures = availability(_history([0.5, 1.5, 2.5], [skipped, kill], rounds=(0.0, 20.0)))
    assert "power-loss" not in figures
    base = figures["no-fault"]
    # 20 windows in the round, [10, 15) lies in the kill's span (t to t_end + 5 s): 15 left
    assert base.windows == 15 and base.available == 3


def test_the_spokes_producer_does_not_count_as_the_pair_answering() -> None:
    kill = Fault(10.0, 10.0, 1, "kill-master", "a", "SIGKILL")
    h = _history([], [kill])
    h.add(Send(11.4, "p-bridged", "/queue/nemesis.bridged", "b1", "rcpt", "ok", 11.5))
    assert availability(h)["kill-master"].available == 0


def test_the_checker_carries_the_figures_in_its_json() -> None:
    kill = Fault(10.0, 10.0, 1, "kill-master", "a", "SIGKILL")
    out = check(_history([11.5], [kill]), complete=False).to_json()
    assert out["availability"]["kill-master"] == {"windows": 4, "available": 1, "share": 0.25, "alone_windows": 4,
                                                  "alone_available": 1, "alone_share": 0.25}


def test_alone_counts_only_the_windows_no_other_fault_is_near() -> None:
    lock = Fault(10.0, 10.0, 1, "delete-lock", "store", "deleted")
    cut = Fault(12.0, 13.0, 1, "half-open-client", "a", "timeout toxic")  # its span: [12, 18)
    a = availability(_history([11.5, 12.5], [lock, cut]))["delete-lock"]
    assert (a.windows, a.available) == (4, 2)  # [11,12) [12,13) [13,14) [14,15)
    assert (a.alone_windows, a.alone_available) == (1, 1)  # only [11,12) is clear of the cut


def test_a_full_shared_disk_is_reported_apart_from_the_single_failures_of_the_pair() -> None:
    full = Fault(10.0, 12.0, 1, "disk-full", "a", "store filled")  # span [11, 17): nothing receipted
    kill = Fault(30.0, 30.0, 1, "kill-master", "a", "SIGKILL")  # span [31, 35): every window answered
    sends = [float(t) + 0.5 for t in range(40) if not 10 <= t < 17]
    shared = availability(_history(sends, [full, kill], mode="shared-store"))
    # the shared store's one disk is no single failure of the pair: its own row, not in single-failures
    assert (shared["disk-full"].windows, shared["disk-full"].available) == (6, 0)
    assert (shared["all-faults"].windows, shared["all-faults"].available) == (10, 4)
    single = shared["single-failures"]
    assert (single.windows, single.available, single.alone_windows, single.alone_available) == (4, 4, 4, 4)
    # a replicated node's disk is its own: a single failure like any other
    replicated = availability(_history(sends, [full, kill], mode="replicated"))
    assert (replicated["single-failures"].windows, replicated["single-failures"].available) == (10, 4)


def test_windows_after_the_harness_stopped_the_producers_are_dropped_not_counted_unavailable() -> None:
    cut = Fault(30.0, 32.0, 1, "partition-clients", "a", "kernel drop")  # span [31, 37)
    sends = [float(t) + 0.5 for t in range(34)]  # the workload sends until 34, then stops
    h = _history(sends, [cut])
    h.meta["workload_stopped_s"] = 34.2
    figures = availability(h)
    a = figures["partition-clients"]
    assert (a.windows, a.available) == (3, 3)  # [31,32) [32,33) [33,34); [34,35) ends after the stop
    base = figures["no-fault"]
    assert base.windows == 30 and base.available == 30  # [0,30): fault time and nothing after the stop
    # a history without the record: the last round's end stands for it
    h = _history(sends, [cut], rounds=(0.0, 34.0))
    assert availability(h)["partition-clients"].windows == 3


# -- LazyFS's overlay -------------------------------------------------------------------------


def test_unsynced_writes_are_read_back_and_lost_on_power_loss() -> None:
    o = Overlay()
    o.write(1, 0, b"hello")
    assert o.size(1, 0) == 5 and o.read(1, 0, 10, b"", 0) == b"hello"
    o.write(1, 3, b"LO world")
    assert o.read(1, 0, 100, b"", 0) == b"helLO world"
    loss, torn = o.power_loss()
    assert (loss.files, loss.bytes, torn) == (1, 13, None)
    assert o.size(1, 0) == 0 and o.read(1, 0, 10, b"", 0) == b""


def test_fsync_hands_over_the_writes_in_order_and_only_that_files() -> None:
    o = Overlay()
    o.write(1, 0, b"aaaa")
    o.write(2, 0, b"bbbb")
    o.write(1, 2, b"XY")
    assert o.take(1) == [(0, b"aaaa"), (2, b"XY")]
    loss, _ = o.power_loss()
    assert loss.bytes == 4  # file 2's write, never fsynced


def test_a_torn_write_keeps_a_strict_prefix_of_the_newest_write() -> None:
    o = Overlay()
    o.write(1, 0, b"old")
    o.write(7, 100, b"0123456789")
    loss, torn = o.power_loss(random.Random(3))
    assert torn is not None and torn[0] == 7 and torn[1] == 100
    assert 1 <= len(torn[2]) < 10 and b"0123456789".startswith(torn[2])
    assert loss.torn == (7, 100, len(torn[2]))


def test_truncate_clips_unsynced_writes() -> None:
    o = Overlay()
    o.write(1, 0, b"0123456789")
    o.truncate(1, 4)
    assert o.read(1, 0, 100, b"", 0) == b"0123"
    o.truncate(1, 0)
    assert o.files == {}


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64), st.lists(st.tuples(st.integers(0, 80), st.binary(min_size=1, max_size=20)), max_size=8),
       st.integers(0, 100), st.integers(0, 100))
def test_the_overlay_reads_as_a_file_written_in_place(base: bytes, writes: list[tuple[int, bytes]], off: int,
                                                      n: int) -> None:
    o = Overlay()
    model = bytearray(base)
    for at, data in writes:
        o.write(9, at, data)
        if len(model) < at:
            model.extend(b"\0" * (at - len(model)))
        model[at:at + len(data)] = data
    assert o.size(9, len(base)) == len(model)
    assert o.read(9, off, n, base[off:off + n], len(base)) == bytes(model[off:off + n])


# -- bit-flip -----------------------------------------------------------------------------------


def _journal(tmp_path: Path, segments: int, records: int = 20) -> Path:
    """A journal of ``segments`` segment files of ``records`` framed Ack records each
    (the store's own record encoding and framing)."""
    d = tmp_path / "journal"
    d.mkdir()
    for seg in range(1, segments + 1):
        frames = [MAGIC]
        for i in range(records):
            payload = encode(Ack((f"ID:m-{seg}-{i}",), "/queue/q"))
            frames.append(FRAME.pack(len(payload), zlib.crc32(payload)) + payload)
        (d / segment_name(seg)).write_bytes(b"".join(frames))
    return d


def test_bit_flip_never_touches_the_newest_record(tmp_path: Path) -> None:
    d = _journal(tmp_path, 1, records=1)
    assert finished_segments(tmp_path) == [] and flip_bit(tmp_path, random.Random(1)) is None
    (d / segment_name(1)).write_bytes(MAGIC)
    assert flip_bit(tmp_path, random.Random(1)) is None


def test_with_one_segment_bit_flip_damages_a_record_followed_by_an_intact_one(tmp_path: Path) -> None:
    d = _journal(tmp_path, 1, records=2)
    flip = flip_bit(tmp_path, random.Random(2))
    assert flip is not None and flip.frame == len(MAGIC)  # the first of the two
    report = verify(d)
    assert [s.segment for s in report.damaged] == [1], report.lines()


def test_bit_flip_damages_one_record_of_a_finished_segment_that_verify_reports(tmp_path: Path) -> None:
    d = _journal(tmp_path, 3)
    before = {p.name: p.read_bytes() for p in d.glob("seg-*.log")}
    flip = flip_bit(tmp_path, random.Random(5))
    assert flip is not None and flip.segment.name != max(before)
    after = flip.segment.read_bytes()
    diff = [i for i, (x, y) in enumerate(zip(before[flip.segment.name], after, strict=True)) if x != y]
    assert diff == [flip.byte] and bin(after[flip.byte] ^ before[flip.segment.name][flip.byte]).count("1") == 1
    assert flip.byte >= flip.frame + FRAME.size  # inside the payload, the length untouched
    assert "Ack" in flip.record and "ID:m-" in flip.record
    report = verify(d)
    assert [s.segment for s in report.damaged] == [int(flip.segment.name[4:-4])]


def test_bit_flip_prefers_a_record_recovery_replays(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Records before the checkpoint's position are never read again by recovery: a
    record at or after it comes first (here: segment 2 from its 10th frame on)."""
    import chaos.nemesis.bitflip as bitflip

    _journal(tmp_path, 3)
    frame = FRAME.size + len(encode(Ack(("ID:m-2-0",), "/queue/q")))
    start = (2, len(MAGIC) + 10 * frame)
    monkeypatch.setattr(bitflip, "replay_start", lambda journal: start)
    for seed in range(20):
        flip = flip_bit(tmp_path, random.Random(seed))
        assert flip is not None and flip.segment.name == segment_name(2) and flip.frame >= start[1], flip
        flipped = bytearray(flip.segment.read_bytes())
        flipped[flip.byte] ^= 1 << flip.bit  # undo, for the next seed
        flip.segment.write_bytes(bytes(flipped))


def test_replay_start_reads_no_position_without_a_usable_checkpoint(tmp_path: Path) -> None:
    from chaos.nemesis.bitflip import replay_start

    assert replay_start(tmp_path) is None
    (tmp_path / "checkpoint").write_bytes(b"not a checkpoint")
    assert replay_start(tmp_path) is None


# -- the health wait ------------------------------------------------------------------------


class _Node:
    """A pair node as the nemesis sees it (alive, start, HA status); ``fence_after``:
    dies after answering that many status requests (a node fencing itself late)."""

    def __init__(self, name: str, role: str, fence_after: int | None = None) -> None:
        self.name, self.role, self.fence_after = name, role, fence_after
        self.alive, self.asked, self.starts = True, 0, 0

    def status(self, timeout: float = 0.5) -> dict[str, str]:
        self.asked += 1
        if self.fence_after is not None and self.asked >= self.fence_after:
            self.alive, self.fence_after = False, None
            return {"amq-ha-role": "slave", "amq-ha-peer-state": "catching-up"}
        if self.role == "master":
            return {"amq-ha-role": "master", "amq-ha-listening": "true"}
        return {"amq-ha-role": "slave", "amq-ha-peer-state": "in-sync" if self.starts else "catching-up"}

    def start(self, timeout: float = 30.0) -> _Node:
        self.alive = True
        self.starts += 1
        return self


def test_wait_healthy_restarts_a_node_that_dies_while_it_waits() -> None:
    """A node that fences itself late (after the round's restart_dead, e.g. at a full disk)
    is started again within the health wait, so the round ends healthy; before, the wait
    ran out with the node down and the run needed a repair (or stopped)."""
    a, b = _Node("a", "master"), _Node("b", "slave", fence_after=2)
    cluster = SimpleNamespace(pair=SimpleNamespace(nodes=[a, b]), kind="replicated")
    nemesis = Nemesis(cluster, None, History({}), time.monotonic)  # type: ignore[arg-type]
    ok, _took, desc = nemesis.wait_healthy(5.0)
    assert ok, desc
    assert b.starts == 1 and a.starts == 0
    b.fence_after = b.asked + 1  # once more: the runner hears whom the wait restarted
    restarted: list[str] = []
    assert nemesis.wait_healthy(5.0, restarted)[0] and restarted == ["b"]


def test_a_node_that_will_not_start_is_left_down_and_tried_again() -> None:
    class Stubborn(_Node):
        def start(self, timeout: float = 30.0) -> _Node:
            raise TimeoutError("no 'ha node' line")

    a, b = _Node("a", "master"), Stubborn("b", "slave")
    b.alive = False
    cluster = SimpleNamespace(pair=SimpleNamespace(nodes=[a, b]), kind="replicated")
    nemesis = Nemesis(cluster, None, History({}), time.monotonic)  # type: ignore[arg-type]
    assert nemesis.restart_dead() == []
    ok, _took, desc = nemesis.wait_healthy(0.5)
    assert not ok and "b: down" in desc
