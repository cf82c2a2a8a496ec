"""Running scenario rounds and judging them.

Theory of operation
-------------------
One **round** (:func:`run_round`) on a ready :class:`~chaos.harness.cluster.Stage`:

1. ``stage.reset()`` (every proxy enabled, no toxic), wait for a serving master;
2. start the consumer (subscribed first), then the producer, on a fresh queue;
3. warm up (``warmup_s`` and at least a few receipts);
4. ``t_fault``: inject the fault; after ``hold_s`` heal it (enable / remove toxics);
5. wait until the first message *sent at or after* ``t_fault`` is receipted: that
   instant minus ``t_fault`` is the **recovery time** (a message already in flight at
   the fault does not count, so a kill cannot look instantaneous); give up at the
   scenario's bound plus a grace;
6. keep producing for ``post_s``, stop and flush the producer, let the consumer drain
   until it has every receipted message (or ``drain_timeout_s``);
7. judge the **invariants**: every receipted message was received (*lost* = 0); no
   message reached the application twice (*duplicates* = 0; the client's dedupe is
   on); recovery within the scenario's bound; for half-open and slow-close, both
   clients noticed the dead link within the detection bound; neither client died
   (``SendTimeout``, ``ReconnectExhausted``); our broker did not store again a send it
   had receipted before the fault (see ``RoundResult.stored_twice_after_receipt``).
   A failed round keeps running the others.
8. after a kill, ``cluster.recover()`` restarts the killed node for the next round
   (not timed).

Throughput is kept as per-``bin_s`` samples (receipted sends, received messages,
send calls) from the round's start, for the report's timeline.
"""

from __future__ import annotations

import contextlib
import logging
import math
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from chaos.harness.clients import ClientSettings
from chaos.harness.cluster import ClusterError, Stage, make_cluster, scratch_dir
from chaos.scenarios.catalog import Scenario, get_scenario
from chaos.scenarios.workload import ConsumerThread, ProducerThread

__all__ = ["RunParams", "RoundResult", "Observations", "judge", "recovery_time", "delivery_time", "samples_of",
           "run_round", "run_scenario", "run_scenarios", "modes_for"]

log = logging.getLogger(__name__)

Clock = Callable[[], float]


@dataclass(frozen=True)
class RunParams:
    rate: float = 200.0  # messages/s offered by the producer (0: as fast as the window allows)
    window: int = 16  # receipts in flight
    warmup_s: float = 1.5
    post_s: float = 2.0
    drain_timeout_s: float = 20.0
    recovery_grace_s: float = 5.0  # wait this long past the bound before giving up
    bin_s: float = 0.25  # timeline resolution; samples are rates in messages/s


@dataclass
class RoundResult:
    scenario: str
    mode: str
    round: int
    fault: str = ""
    sent: int = 0
    receipted: int = 0
    received: int = 0
    lost: int = 0
    lost_sample: list[int] = field(default_factory=list)
    duplicates: int = 0
    deduped: int = 0  # copies dropped by the client's duplicate filter
    redelivered: int = 0  # copies on the wire with a message-id seen before
    stored_twice: int = 0  # extra copies on the wire under a new message-id: a send stored twice
    # ... of which the original had been receipted before the fault: the broker knew
    # the idempotency key durably and still stored the replay (a dedupe failure). The
    # others were in flight: dispatched to the consumer before they were durable (store
    # and dispatch run concurrently), lost with the killed process, replayed by the
    # client and stored once more: at-least-once, which the client's dedupe absorbs.
    stored_twice_after_receipt: int = 0
    stored_twice_sample: list[str] = field(default_factory=list)  # "seq: id1, id2"
    foreign: int = 0
    recovery_s: float | None = None
    recovery_bound_s: float = 0.0
    # fault -> arrival at the consumer of the first message sent after it (the
    # consumer's own outage, e.g. a quiet link only heart-beats can find)
    delivery_s: float | None = None
    detection_s: float | None = None
    detection_bound_s: float | None = None
    reconnects: int = 0
    fault_at: float = 0.0  # offsets from the round's start (s)
    heal_at: float | None = None
    duration_s: float = 0.0
    master_before: str = ""
    master_after: str = ""
    samples: list[dict[str, float]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def label(self) -> str:
        return f"{self.scenario}[{self.mode}]"

    def line(self, rounds: int | None = None) -> str:
        of = f"/{rounds}" if rounds else ""
        rec = "-" if self.recovery_s is None else f"{self.recovery_s:.2f}s"
        det = "" if self.detection_s is None else f" detect {self.detection_s:.2f}s"
        if self.delivery_s is not None:
            det += f" delivery {self.delivery_s:.2f}s"
        verdict = "OK" if self.ok else "FAIL: " + "; ".join(self.failures)
        return (
            f"{self.label} round {self.round}{of}: sent {self.sent} receipted {self.receipted} "
            f"received {self.received} lost {self.lost} dup {self.duplicates} deduped {self.deduped} "
            f"(stored twice {self.stored_twice}) "
            f"recovery {rec} (bound {self.recovery_bound_s:g}s){det} "
            f"reconnects {self.reconnects} {verdict}"
        )

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["ok"] = self.ok
        return data


def _bins(times: Iterable[float], start: float, width: float, count: int) -> list[int]:
    out = [0] * count
    for t in times:
        i = int((t - start) // width)
        if 0 <= i < count:
            out[i] += 1
    return out


def samples_of(send_times: Sequence[float], receipt_times: Sequence[float],
               received_times: Sequence[float], t0: float, t_end: float,
               width: float) -> list[dict[str, float]]:
    """Rates (messages/s) per ``width``-second bin from ``t0`` to ``t_end``."""
    count = max(1, math.ceil((t_end - t0) / width))
    sent = _bins(send_times, t0, width, count)
    receipted = _bins(receipt_times, t0, width, count)
    received = _bins(received_times, t0, width, count)
    return [
        {"t": round(i * width, 3), "sent": sent[i] / width, "receipted": receipted[i] / width,
         "received": received[i] / width}
        for i in range(count)
    ]


def _recovery(producer: ProducerThread, t_fault: float) -> float | None:
    return recovery_time(producer.send_times, producer.receipt_times, t_fault)


def _wait(pred: Callable[[], bool], timeout: float, step: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return pred()


def run_round(stage: Stage, scenario: Scenario, round_no: int, params: RunParams = RunParams(),
              *, mode: str = "", clock: Clock = time.monotonic) -> RoundResult:
    """One round (see the module docstring); never raises for a broken invariant."""
    result = RoundResult(scenario=scenario.name, mode=mode or stage.cluster.kind, round=round_no,
                         recovery_bound_s=scenario.recovery_bound_s,
                         detection_bound_s=scenario.detection_bound_s)
    round_id = f"{scenario.name}-{result.mode}-{round_no}-{uuid.uuid4().hex[:6]}"
    destination = getattr(stage.cluster, "destination", None) or f"/queue/chaos.{round_id}"
    stage.reset()
    master = stage.cluster.master_index(timeout=60)
    result.master_before = stage.cluster.names[master]
    bound = scenario.recovery_bound_s
    settings = ClientSettings(
        uri=stage.uri(timeout_ms=int((bound + params.recovery_grace_s) * 1000)),
        heartbeat_ms=scenario.heartbeat_ms,
        connect_timeout_s=scenario.connect_timeout_s,
        login=stage.cluster.login,
        passcode=stage.cluster.passcode,
    )
    producer_uri = getattr(stage.cluster, "producer_uri", None)
    producer_settings = replace(settings, uri=producer_uri) if producer_uri else settings
    consumer = ConsumerThread(settings, destination, round_id, clock=clock)
    producer = ProducerThread(producer_settings, destination, round_id, rate=params.rate,
                              window=params.window, clock=clock,
                              flush_timeout_s=bound + params.recovery_grace_s)

    def recovered_now() -> float | None:
        if scenario.recovery_by == "delivery":
            with consumer.lock:
                return delivery_time(producer.send_times, consumer.received, t_fault)
        return _recovery(producer, t_fault)
    consumer.start()
    consumer.subscribed.wait(60)
    t0 = clock()
    t_fault = t_end = t0
    try:
        if consumer.error is not None:
            result.failures.append(f"consumer could not start: {consumer.error!r}")
            return result
        producer.start()
        producer.connected.wait(60)
        if producer.error is not None:
            result.failures.append(f"producer could not start: {producer.error!r}")
            return result
        t0 = clock()
        _wait(lambda: clock() - t0 >= params.warmup_s and producer.receipted >= 5,
              params.warmup_s + 30)
        _wait(lambda: consumer.count() >= 5, 30)  # end to end (a bridge may take a moment)
        if producer.receipted < 5 or consumer.count() < 5:
            result.failures.append(f"no traffic before the fault ({producer.receipted} receipts, "
                                   f"{consumer.count()} received in warm-up)")
            return result

        t_fault = clock()
        try:
            result.fault = scenario.inject(stage)
            # the instant the fault took effect, when the fault marked it (a toxic is in
            # force once the API answered; a SIGKILL at once)
            t_fault = stage.active.get("t_fault", t_fault)
            if scenario.heal is not None:
                remaining = scenario.hold_s - (clock() - t_fault)
                if remaining > 0:
                    time.sleep(remaining)
                scenario.heal(stage)
                result.heal_at = clock() - t0
        except Exception as exc:  # a broken fault is a failed round, not a crashed run
            log.exception("fault injection failed")
            result.failures.append(f"fault injection/heal failed: {exc!r}")
        result.fault_at = t_fault - t0
        limit = t_fault + bound + params.recovery_grace_s
        _wait(lambda: recovered_now() is not None or producer.error is not None
              or not producer.is_alive(), max(0.0, limit - clock()))
        recovered = recovered_now()
        post_from = clock() if recovered is None else t_fault + recovered
        if result.heal_at is not None:
            post_from = max(post_from, t0 + result.heal_at)
        remaining = post_from + params.post_s - clock()
        if remaining > 0:
            time.sleep(remaining)
    finally:
        producer.stop()
        if producer.is_alive() or producer.ident is not None:
            producer.join(bound + params.recovery_grace_s + 5)
            if producer.is_alive():
                result.failures.append("producer stuck after stop: aborted")
                producer.abort()
                producer.join(10)
        receipted_n = producer.receipted
        _wait(lambda: consumer.has_all(range(receipted_n)) or not consumer.is_alive(),
              params.drain_timeout_s, step=0.05)
        time.sleep(0.2)  # a late duplicate would arrive now
        consumer.stop()
        consumer.join(10)
        t_end = clock()

    wire = consumer.wire_counts()
    obs = Observations(
        send_times=list(producer.send_times), receipt_times=list(producer.receipt_times),
        received=dict(consumer.received), duplicates=consumer.duplicates, deduped=consumer.deduped,
        foreign=consumer.foreign, redelivered=wire[0], stored_twice_ids=wire[1],
        producer_interruptions=list(producer.events.interrupted),
        consumer_interruptions=list(consumer.events.interrupted), producer_error=producer.error,
        consumer_error=consumer.error, t0=t0, t_fault=t_fault, t_end=t_end,
    )
    with contextlib.suppress(Exception):
        result.master_after = stage.cluster.names[stage.cluster.master_index(timeout=30)]
    judge(result, obs, scenario, params)
    return result


@dataclass
class Observations:
    """What a round's clients saw (clock seconds), the input of :func:`judge`."""

    send_times: list[float]  # index = seq
    receipt_times: list[float]  # index = seq (receipts are reaped in send order)
    received: dict[int, float]  # seq -> first arrival at the application
    duplicates: int = 0
    deduped: int = 0
    redelivered: int = 0
    stored_twice_ids: dict[int, list[str]] = field(default_factory=dict)  # seq -> message-ids
    foreign: int = 0
    producer_interruptions: list[float] = field(default_factory=list)
    consumer_interruptions: list[float] = field(default_factory=list)
    producer_error: BaseException | None = None
    consumer_error: BaseException | None = None
    t0: float = 0.0
    t_fault: float = 0.0
    t_end: float = 0.0


def recovery_time(send_times: Sequence[float], receipt_times: Sequence[float], t_fault: float) -> float | None:
    """Fault to the receipt of the first message sent at or after the fault."""
    seq = next((i for i, t in enumerate(send_times) if t >= t_fault), None)
    if seq is None or seq >= len(receipt_times):
        return None
    return receipt_times[seq] - t_fault


def delivery_time(send_times: Sequence[float], received: Mapping[int, float], t_fault: float) -> float | None:
    """Fault to the arrival at the consumer of the first message sent at or after it."""
    seq = next((i for i, t in enumerate(send_times) if t >= t_fault), None)
    if seq is None or seq not in received:
        return None
    return received[seq] - t_fault


def judge(result: RoundResult, obs: Observations, scenario: Scenario, params: RunParams) -> RoundResult:
    """Fill ``result``'s counts, recovery, samples and invariant failures from ``obs``."""
    t_fault = obs.t_fault
    bound = scenario.recovery_bound_s
    result.sent = len(obs.send_times)
    result.receipted = len(obs.receipt_times)
    result.received = len(obs.received)
    missing = [s for s in range(result.receipted) if s not in obs.received]
    result.lost = len(missing)
    result.lost_sample = missing[:10]
    result.duplicates = obs.duplicates
    result.deduped = obs.deduped
    result.redelivered = obs.redelivered
    result.stored_twice = sum(len(ids) - 1 for ids in obs.stored_twice_ids.values())
    after_receipt = [s for s in obs.stored_twice_ids
                     if s < len(obs.receipt_times) and obs.receipt_times[s] < t_fault]
    result.stored_twice_after_receipt = sum(len(obs.stored_twice_ids[s]) - 1 for s in after_receipt)
    result.stored_twice_sample = [f"{s}: {', '.join(ids)}" for s, ids in list(obs.stored_twice_ids.items())[:5]]
    result.foreign = obs.foreign
    result.fault_at = t_fault - obs.t0
    result.delivery_s = delivery_time(obs.send_times, obs.received, t_fault)
    if scenario.recovery_by == "delivery":
        result.recovery_s = result.delivery_s
    else:
        result.recovery_s = recovery_time(obs.send_times, obs.receipt_times, t_fault)
    result.reconnects = len([t for t in obs.producer_interruptions if t >= t_fault])
    result.duration_s = obs.t_end - obs.t0
    result.samples = samples_of(obs.send_times, obs.receipt_times, list(obs.received.values()),
                                obs.t0, obs.t_end, params.bin_s)

    if result.lost:
        result.failures.append(f"{result.lost} receipted message(s) never received (e.g. seq {missing[:5]})")
    if result.duplicates:
        result.failures.append(f"{result.duplicates} duplicate(s) delivered to the application")
    if result.stored_twice_after_receipt and scenario.broker_dedupes:
        examples = [f"{s}: {', '.join(obs.stored_twice_ids[s])}" for s in after_receipt[:2]]
        result.failures.append(
            f"the broker stored {result.stored_twice_after_receipt} send(s) twice although the "
            f"original was receipted before the fault (seq: message-ids {examples})")
    if result.recovery_s is None:
        what = "delivery" if scenario.recovery_by == "delivery" else "receipted send"
        result.failures.append(f"no {what} after the fault within {bound + params.recovery_grace_s:g}s")
    elif result.recovery_s > bound:
        result.failures.append(f"recovery {result.recovery_s:.2f}s exceeds its bound {bound:g}s")
    if scenario.detection_bound_s is not None:
        detections = [next((t for t in ts if t >= t_fault), None)
                      for ts in (obs.producer_interruptions, obs.consumer_interruptions)]
        if any(d is None for d in detections):
            result.failures.append("a client never noticed the dead link (no heart-beat timeout)")
        else:
            result.detection_s = max(d - t_fault for d in detections if d is not None)
            if result.detection_s > scenario.detection_bound_s:
                result.failures.append(
                    f"dead link noticed after {result.detection_s:.2f}s "
                    f"(bound {scenario.detection_bound_s:g}s)")
    if obs.producer_error is not None:
        result.failures.append(f"producer failed: {obs.producer_error!r}")
    if obs.consumer_error is not None:
        result.failures.append(f"consumer failed: {obs.consumer_error!r}")
    return result


def modes_for(scenario: Scenario, requested: Sequence[str]) -> list[str]:
    """The cluster kinds to run ``scenario`` on: the requested modes it supports, or
    its own single kind (e.g. ``activemq``) when none of them applies."""
    chosen = [m for m in requested if m in scenario.kinds]
    return chosen or ([scenario.kinds[0]] if len(scenario.kinds) == 1 else [])


def run_scenario(scenario: Scenario | str, mode: str, rounds: int = 1, params: RunParams = RunParams(),
                 *, workdir: Path | None = None,
                 on_round: Callable[[RoundResult], None] | None = None,
                 keep_on_failure: bool = True) -> list[RoundResult]:
    """All rounds of one scenario on one freshly started cluster; the cluster and the
    proxies are stopped on the way out, even on an error. The scratch directory is
    removed unless a round failed and ``keep_on_failure`` (it holds the broker logs)."""
    sc = get_scenario(scenario) if isinstance(scenario, str) else scenario
    base = scratch_dir(workdir)
    results: list[RoundResult] = []
    failed = True
    try:
        try:
            cluster = make_cluster(mode, base, sc.topology)
        except ClusterError:
            raise
        except Exception as exc:  # e.g. ActiveMQError, a pair that never elects a master
            raise ClusterError(f"{sc.name}[{mode}]: the cluster did not start: {exc}") from exc
        try:
            with Stage(cluster, prefix=sc.name) as stage:
                for n in range(1, rounds + 1):
                    try:
                        result = run_round(stage, sc, n, params, mode=mode)
                    except Exception as exc:  # the cluster is in an unknown state: stop here
                        log.exception("round %d of %s[%s] aborted", n, sc.name, mode)
                        result = RoundResult(scenario=sc.name, mode=mode, round=n,
                                             recovery_bound_s=sc.recovery_bound_s,
                                             failures=[f"round aborted: {exc!r}"])
                    broken = not result.ok and result.failures[0].startswith("round aborted")
                    if sc.kills and not broken:
                        try:
                            cluster.recover(timeout=60)
                        except Exception as exc:
                            result.failures.append(f"the cluster did not recover after the round: {exc}")
                            broken = True
                    results.append(result)
                    if on_round is not None:
                        on_round(result)
                    if broken:
                        break
        finally:
            cluster.close()
        failed = any(not r.ok for r in results)
    finally:
        if failed and keep_on_failure:
            log.warning("scenario %s[%s]: scratch directory kept at %s", sc.name, mode, base)
        else:
            shutil.rmtree(base, ignore_errors=True)
    return results


def run_scenarios(names: Sequence[str], modes: Sequence[str], rounds: int = 1,
                  params: RunParams = RunParams(), *, workdir: Path | None = None,
                  on_round: Callable[[RoundResult], None] | None = None) -> list[RoundResult]:
    results: list[RoundResult] = []
    for name in names:
        sc = get_scenario(name)
        for mode in modes_for(sc, modes):
            results.extend(run_scenario(sc, mode, rounds, params, workdir=workdir, on_round=on_round))
    return results
