"""Each toxic against a fake stage with a virtual clock: exact timings, no real waiting.

The proxy gives toxics their clock, sleep and timers through the ``ToxicStage`` protocol,
so these tests check the arithmetic (latency from read time, bandwidth slices and
carried debt, slicer delays) and the interrupt rules (data held when a toxic is
removed is passed on, never dropped) deterministically.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from chaos.proxy.toxics import (
    BandwidthToxic,
    Chunk,
    EndOfStream,
    LatencyToxic,
    LimitDataToxic,
    ResetPeerToxic,
    SlicerToxic,
    SlowCloseToxic,
    TimeoutToxic,
    Toxic,
    make_toxic,
)


class FakeTimer:
    def __init__(self, at: float, callback: Any) -> None:
        self.at = at
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeStage:
    """The ``ToxicStage`` protocol with a virtual clock; ``interrupt_after`` sleeps end early."""

    def __init__(self, now: float = 0.0, interrupt_after: int | None = None) -> None:
        self.clock = now
        self.state: dict[str, Any] = {}
        self.rng = random.Random(1)
        self.emitted: list[tuple[float, bytes]] = []
        self.sleeps: list[float] = []
        self.timers: list[FakeTimer] = []
        self.closed = 0
        self.interrupt_after = interrupt_after

    async def emit(self, chunk: Chunk) -> None:
        self.emitted.append((self.clock, chunk.data))

    async def sleep(self, seconds: float) -> bool:
        if self.interrupt_after is not None and len(self.sleeps) >= self.interrupt_after:
            return False
        self.sleeps.append(seconds)
        self.clock += seconds
        return True

    def now(self) -> float:
        return self.clock

    def call_later(self, seconds: float, callback: Any) -> FakeTimer:
        timer = FakeTimer(self.clock + seconds, callback)
        self.timers.append(timer)
        return timer

    def close_stream(self) -> None:
        self.closed += 1

    def data(self) -> bytes:
        return b"".join(d for _, d in self.emitted)


def run(toxic: Toxic, stage: FakeStage, *chunks: Chunk) -> None:
    async def go() -> None:
        for chunk in chunks:
            await toxic.on_chunk(stage, chunk)

    asyncio.run(go())


def test_latency_counts_from_read_time() -> None:
    stage = FakeStage(now=0.05)
    run(LatencyToxic(latency=100), stage, Chunk(b"a", 0.0), Chunk(b"b", 0.01))
    # chunk a waits 50 ms more (read at 0, now 0.05); chunk b is then due at 0.11
    assert stage.sleeps == pytest.approx([0.05, 0.01])
    assert [(round(t, 3), d) for t, d in stage.emitted] == [(0.1, b"a"), (0.11, b"b")]


def test_latency_jitter_stays_in_range() -> None:
    toxic = LatencyToxic(latency=100, jitter=30)
    rng = random.Random(5)
    delays = {toxic.delay_ms(rng) for _ in range(500)}
    assert min(delays) >= 70 and max(delays) < 130 and len(delays) > 20


def test_latency_interrupted_passes_the_chunk_on_at_once() -> None:
    stage = FakeStage(interrupt_after=0)
    run(LatencyToxic(latency=10_000), stage, Chunk(b"held", 0.0))
    assert stage.emitted == [(0.0, b"held")]


def test_bandwidth_slices_and_rate() -> None:
    stage = FakeStage()
    run(BandwidthToxic(rate=100), stage, Chunk(b"x" * 25_000, 0.0))
    # 100 KB/s: 10,000 bytes per 100 ms slice, the remaining 5,000 after 50 ms more
    assert [len(d) for _, d in stage.emitted] == [10_000, 10_000, 5_000]
    assert stage.clock == pytest.approx(0.25)
    assert stage.data() == b"x" * 25_000


def test_bandwidth_carries_its_debt_across_small_chunks() -> None:
    stage = FakeStage()
    run(BandwidthToxic(rate=10), stage, *[Chunk(b"y" * 100, 0.0) for _ in range(50)])
    assert stage.clock == pytest.approx(0.5)  # 5,000 bytes at 10 KB/s
    assert len(stage.data()) == 5_000


def test_bandwidth_interrupted_keeps_the_data() -> None:
    stage = FakeStage(interrupt_after=1)
    run(BandwidthToxic(rate=1), stage, Chunk(bytes(range(256)) * 4, 0.0))
    assert stage.data() == bytes(range(256)) * 4  # one slice, then the rest at once


def test_bandwidth_zero_stalls_until_interrupted() -> None:
    stage = FakeStage(interrupt_after=3)
    run(BandwidthToxic(rate=0), stage, Chunk(b"kept", 0.0))
    assert stage.clock == pytest.approx(3 * 3600.0)
    assert stage.data() == b"kept"


def test_slicer_sizes_and_delays() -> None:
    stage = FakeStage()
    run(SlicerToxic(average_size=10, size_variation=3, delay=500), stage, Chunk(b"z" * 1000, 0.0))
    sizes = [len(d) for _, d in stage.emitted]
    assert sum(sizes) == 1000 and stage.data() == b"z" * 1000
    assert all(1 <= s <= 13 for s in sizes)
    assert stage.sleeps == pytest.approx([0.0005] * (len(sizes) - 1))


def test_slicer_interrupted_sends_the_rest_at_once() -> None:
    stage = FakeStage(interrupt_after=2)
    run(SlicerToxic(average_size=10, delay=1000), stage, Chunk(bytes(range(100)), 0.0))
    assert stage.data() == bytes(range(100))
    assert len(stage.emitted) == 4  # three slices, then the remainder


def test_limit_data_counts_across_chunks_then_ends() -> None:
    stage = FakeStage()
    toxic = LimitDataToxic(bytes=10)
    run(toxic, stage, Chunk(b"abcdef", 0.0))
    with pytest.raises(EndOfStream):
        run(toxic, stage, Chunk(b"ghijkl", 0.0))
    assert stage.data() == b"abcdefghij"


def test_limit_data_zero_ends_at_the_first_chunk() -> None:
    stage = FakeStage()
    with pytest.raises(EndOfStream):
        run(LimitDataToxic(bytes=0), stage, Chunk(b"nothing", 0.0))
    assert stage.emitted == []


def test_reset_peer_drops_waits_and_ends() -> None:
    stage = FakeStage()
    with pytest.raises(EndOfStream):
        run(ResetPeerToxic(timeout=250), stage, Chunk(b"dropped", 0.0))
    assert stage.emitted == [] and stage.sleeps == [0.25]


def test_timeout_drops_rearms_and_closes_when_removed() -> None:
    stage = FakeStage()
    toxic = TimeoutToxic(timeout=300)
    toxic.on_start(stage)
    assert len(stage.timers) == 1 and stage.timers[0].at == pytest.approx(0.3)
    run(toxic, stage, Chunk(b"gone", 0.0))
    assert stage.emitted == []
    assert stage.timers[0].cancelled and len(stage.timers) == 2  # each chunk restarts it
    stage.timers[1].callback()
    assert stage.closed == 1
    toxic.on_stop(stage, removed=True)
    assert stage.closed == 2  # removing it closes the connection: bytes were lost


def test_timeout_zero_never_arms_a_timer() -> None:
    stage = FakeStage()
    toxic = TimeoutToxic(timeout=0)
    toxic.on_start(stage)
    run(toxic, stage, Chunk(b"void", 0.0))
    assert stage.timers == [] and stage.emitted == [] and stage.closed == 0
    toxic.on_stop(stage, removed=False)  # an update, not a removal: no close
    assert stage.closed == 0


def test_slow_close_waits_on_eof() -> None:
    stage = FakeStage()
    asyncio.run(SlowCloseToxic(delay=700).on_eof(stage))
    assert stage.sleeps == [0.7]


def test_make_toxic_merges_on_update() -> None:
    base = make_toxic("latency", {"latency": 100, "jitter": 7})
    updated = make_toxic("latency", {"latency": 5, "unknown": "ignored"}, base=base)
    assert updated.attributes() == {"latency": 5, "jitter": 7}
