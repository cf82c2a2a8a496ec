"""run_until_idle: the rule of "the input is drained" (pure: a scripted query, an injected clock)."""

from __future__ import annotations

from typing import Any

import pytest

from amqtransport.spark.idle import run_until_idle


class ScriptedQuery:
    """Each ``processAllAvailable()`` round runs the next scripted batches (rows each; an
    empty round is a poll that found nothing, e.g. while the broker is slow to
    redeliver) and takes ``round_seconds`` of the clock."""

    def __init__(self, rounds: list[list[int]], round_seconds: float = 0.5) -> None:
        self.rounds = rounds
        self.round_seconds = round_seconds
        self.now = 0.0
        self.calls = 0
        self.recentProgress: list[dict[str, Any]] = []  # noqa: N815 - Spark's name
        self._batch = 0

    def clock(self) -> float:
        return self.now

    def processAllAvailable(self) -> None:  # noqa: N802 - Spark's name
        script = self.rounds[self.calls] if self.calls < len(self.rounds) else []
        self.calls += 1
        self.now += self.round_seconds
        for rows in script:
            self.recentProgress.append({"batchId": self._batch, "numInputRows": rows})
            self._batch += 1
        self.recentProgress = self.recentProgress[-100:]  # Spark keeps the last 100


def test_a_stall_shorter_than_idle_does_not_end_the_run() -> None:
    # two batches, then two empty rounds (1 s: a single processAllAvailable() would have
    # returned here, with 120 of the 240 rows), then the rest
    q = ScriptedQuery([[60, 60], [], [], [60], [60]])
    assert run_until_idle(q, idle=3.0, clock=q.clock) == 240
    assert q.calls == 5 + 6  # the scripted rounds, then 3 s of empty rounds
    assert q.now == pytest.approx(5.5)


def test_counts_batches_beyond_the_last_100_progress_reports() -> None:
    q = ScriptedQuery([[10] * 150, [10] * 5])  # 150 batches in one round: recentProgress keeps 100
    # the first 50 batches fall out of recentProgress before they are read: the count is
    # what the reports showed, but the run still waits for the input to go quiet
    assert run_until_idle(q, idle=1.0, clock=q.clock) == 1050
    assert q.calls == 2 + 2


def test_an_idle_input_ends_after_idle_seconds() -> None:
    q = ScriptedQuery([])
    assert run_until_idle(q, idle=2.0, clock=q.clock) == 0
    assert q.now == pytest.approx(2.5)  # the first round starts the clock


def test_idle_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="idle must be >= 0"):
        run_until_idle(ScriptedQuery([]), idle=-1)
