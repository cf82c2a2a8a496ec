"""Toxics: one class per Toxiproxy 2.x toxic type, with its attributes and behaviour.

A toxic class is a frozen dataclass of integer attributes (Toxiproxy's names and
units) plus the behaviour it applies to one direction of one connection. The proxy
(``chaos.proxy.proxy``) owns the plumbing; a toxic only sees a :class:`ToxicStage`, its handle on
one connection-direction:

- ``on_start(stage)``: the toxic begins on that connection-direction (timers start);
- ``await on_chunk(stage, chunk)``: transform a chunk and pass what remains on with
  ``await stage.emit(chunk)`` (zero, one or many times), or end the stream by raising
  :class:`EndOfStream` after emitting what should still get through;
- ``await on_eof(stage)``: the input ended; delay the close if the toxic wants to;
- ``on_stop(stage, removed)``: the toxic leaves the connection (``removed``) or is
  about to be replaced by an updated copy (``removed=False``).

Waiting is always ``await stage.sleep(seconds)``, which returns ``False`` early when
the toxic is removed or updated; a toxic then passes on what it holds at once, so no
byte is lost or reordered by a change of configuration.

Attribute validation lives here too (:func:`make_toxic`): each attribute is a
non-negative integer; unknown attribute names are ignored, as Toxiproxy ignores
unknown JSON fields.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from chaos.proxy.errors import BadRequest

__all__ = [
    "Chunk",
    "ToxicStage",
    "EndOfStream",
    "ToxicConfigError",
    "Toxic",
    "NoopToxic",
    "LatencyToxic",
    "BandwidthToxic",
    "SlowCloseToxic",
    "TimeoutToxic",
    "ResetPeerToxic",
    "SlicerToxic",
    "LimitDataToxic",
    "TOXIC_TYPES",
    "make_toxic",
    "STREAMS",
]

STREAMS = ("upstream", "downstream")


@dataclass
class Chunk:
    """Bytes read from one socket, stamped with the loop time at which they were read."""

    data: bytes
    timestamp: float


class EndOfStream(Exception):  # noqa: N818 - a signal, not an error
    """Raised by a toxic to end its direction after what it already emitted.

    The proxy closes the connection as if the input had ended at that toxic: toxics
    after it still see the end (a ``slow_close`` after it still delays the close).
    """

    def __init__(self) -> None:
        super().__init__("end of stream")
        self.after_seq: int | None = None


class ToxicConfigError(BadRequest):
    """A toxic's type or attributes are invalid (HTTP 400); the message names what is wrong."""


class ToxicStage(Protocol):
    """One toxic on one direction of one connection (implemented by ``chaos.proxy.proxy``)."""

    state: dict[str, Any]
    rng: random.Random

    async def emit(self, chunk: Chunk) -> None:
        """Pass a chunk on to the next toxic, or to the destination socket."""

    async def sleep(self, seconds: float) -> bool:
        """Wait; ``True`` when the time elapsed, ``False`` when interrupted early."""

    def now(self) -> float:
        """The loop's monotonic clock, in seconds."""

    def call_later(self, seconds: float, callback: Any) -> Any:
        """Schedule ``callback()``; returns a handle with ``cancel()``."""

    def close_stream(self) -> None:
        """End this direction from outside a chunk (a timer): the connection closes."""


@dataclass(frozen=True)
class Toxic:
    """Base class; subclasses declare their integer attributes as dataclass fields."""

    type_name: ClassVar[str] = ""

    def attributes(self) -> dict[str, int]:
        """Every attribute of the type, zero-filled (what the API replies with)."""
        return {f.name: int(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def on_start(self, stage: ToxicStage) -> None:
        return None

    async def on_chunk(self, stage: ToxicStage, chunk: Chunk) -> None:
        await stage.emit(chunk)

    async def on_eof(self, stage: ToxicStage) -> None:
        return None

    def on_stop(self, stage: ToxicStage, removed: bool) -> None:
        return None


@dataclass(frozen=True)
class NoopToxic(Toxic):
    """Passes everything through unchanged."""

    type_name: ClassVar[str] = "noop"


@dataclass(frozen=True)
class LatencyToxic(Toxic):
    """Delays each chunk to its read time plus ``latency`` ± ``jitter`` milliseconds.

    The delay counts from the moment the chunk was read, so back-to-back chunks do
    not pile their delays up.
    """

    type_name: ClassVar[str] = "latency"
    latency: int = 0
    jitter: int = 0

    def delay_ms(self, rng: random.Random) -> int:
        delay = self.latency
        if self.jitter > 0:
            delay += rng.randrange(self.jitter * 2) - self.jitter
        return delay

    async def on_chunk(self, stage: ToxicStage, chunk: Chunk) -> None:
        release = chunk.timestamp + self.delay_ms(stage.rng) / 1000.0
        wait = release - stage.now()
        if wait > 0 and await stage.sleep(wait):
            chunk.timestamp = release
        await stage.emit(chunk)


@dataclass(frozen=True)
class BandwidthToxic(Toxic):
    """Limits throughput to ``rate`` KB/s (1 KB = 1000 bytes); 0 stalls, keeping data.

    A chunk larger than 100 ms worth of rate is sent in 100 ms slices; the sleep owed
    carries across chunks so the long-run rate is exact.
    """

    type_name: ClassVar[str] = "bandwidth"
    rate: int = 0

    async def on_chunk(self, stage: ToxicStage, chunk: Chunk) -> None:
        if self.rate <= 0:
            # Stall until the toxic is removed or updated; then pass the data on.
            while await stage.sleep(3600.0):
                pass
            await stage.emit(chunk)
            return
        data = chunk.data
        debt: float = stage.state.get("debt", 0.0) + len(data) / (self.rate * 1000.0)
        slice_size = self.rate * 100
        while len(data) > slice_size:
            if not await stage.sleep(0.1):
                stage.state["debt"] = 0.0
                await stage.emit(Chunk(data, chunk.timestamp))
                return
            await stage.emit(Chunk(data[:slice_size], chunk.timestamp))
            data = data[slice_size:]
            debt -= 0.1
        started = stage.now()
        if debt > 0 and not await stage.sleep(debt):
            stage.state["debt"] = 0.0
            await stage.emit(Chunk(data, chunk.timestamp))
            return
        # Carry the timer's error (over- or under-sleeping) into the next chunk.
        stage.state["debt"] = debt - (stage.now() - started)
        await stage.emit(Chunk(data, chunk.timestamp))


@dataclass(frozen=True)
class SlowCloseToxic(Toxic):
    """Delays passing the close on by ``delay`` milliseconds."""

    type_name: ClassVar[str] = "slow_close"
    delay: int = 0

    async def on_eof(self, stage: ToxicStage) -> None:
        if self.delay > 0:
            await stage.sleep(self.delay / 1000.0)


@dataclass(frozen=True)
class TimeoutToxic(Toxic):
    """Drops all data; closes after ``timeout`` ms without input (0: never, half-open).

    Each chunk restarts the timer. Removing the toxic closes the connection, since
    bytes were lost.
    """

    type_name: ClassVar[str] = "timeout"
    timeout: int = 0

    def _arm(self, stage: ToxicStage) -> None:
        handle = stage.state.pop("timer", None)
        if handle is not None:
            handle.cancel()
        if self.timeout > 0:
            stage.state["timer"] = stage.call_later(self.timeout / 1000.0, stage.close_stream)

    def on_start(self, stage: ToxicStage) -> None:
        self._arm(stage)

    async def on_chunk(self, stage: ToxicStage, chunk: Chunk) -> None:
        self._arm(stage)  # drop the data on the floor, restart the timer

    def on_stop(self, stage: ToxicStage, removed: bool) -> None:
        handle = stage.state.pop("timer", None)
        if handle is not None:
            handle.cancel()
        if removed:
            stage.close_stream()


@dataclass(frozen=True)
class ResetPeerToxic(Toxic):
    """On the first data: drop it, wait ``timeout`` ms, then close.

    The close is a TCP RST on connections opened while a ``reset_peer`` toxic existed
    (the proxy sets SO_LINGER 0 on both sockets when it opens them).
    """

    type_name: ClassVar[str] = "reset_peer"
    timeout: int = 0

    async def on_chunk(self, stage: ToxicStage, chunk: Chunk) -> None:
        if self.timeout > 0:
            await stage.sleep(self.timeout / 1000.0)
        raise EndOfStream()


@dataclass(frozen=True)
class SlicerToxic(Toxic):
    """Slices each chunk into pieces of about ``average_size`` ± ``size_variation``
    bytes, waiting ``delay`` **microseconds** between pieces."""

    type_name: ClassVar[str] = "slicer"
    average_size: int = 0
    size_variation: int = 0
    delay: int = 0

    def boundaries(self, length: int, rng: random.Random) -> list[int]:
        """Split ``[0, length)`` by halving until a piece is within the variation."""
        average = max(1, self.average_size)
        variation = self.size_variation
        cuts: list[int] = []
        stack = [(0, length)]
        while stack:
            start, end = stack.pop()
            if (end - start) - average <= variation or end - start <= 1:
                cuts.append(end)
                continue
            mid = start + (end - start) // 2
            if variation > 0:
                mid += rng.randrange(variation * 2) - variation
            mid = min(max(mid, start + 1), end - 1)
            stack.append((mid, end))
            stack.append((start, mid))
        return cuts

    async def on_chunk(self, stage: ToxicStage, chunk: Chunk) -> None:
        start = 0
        cuts = self.boundaries(len(chunk.data), stage.rng)
        for i, end in enumerate(cuts):
            await stage.emit(Chunk(chunk.data[start:end], chunk.timestamp))
            start = end
            if i + 1 < len(cuts) and self.delay > 0 and not await stage.sleep(self.delay / 1e6):
                await stage.emit(Chunk(chunk.data[start:], chunk.timestamp))
                return


@dataclass(frozen=True)
class LimitDataToxic(Toxic):
    """Passes ``bytes`` bytes per connection and direction, then closes."""

    type_name: ClassVar[str] = "limit_data"
    bytes: int = 0

    async def on_chunk(self, stage: ToxicStage, chunk: Chunk) -> None:
        sent: int = stage.state.get("sent", 0)
        remaining = max(0, self.bytes - sent)
        data = chunk.data[:remaining]
        if data:
            stage.state["sent"] = sent + len(data)
            await stage.emit(Chunk(data, chunk.timestamp))
        if self.bytes - stage.state.get("sent", 0) <= 0:
            raise EndOfStream()


TOXIC_TYPES: dict[str, type[Toxic]] = {
    cls.type_name: cls
    for cls in (
        NoopToxic,
        LatencyToxic,
        BandwidthToxic,
        SlowCloseToxic,
        TimeoutToxic,
        ResetPeerToxic,
        SlicerToxic,
        LimitDataToxic,
    )
}

_MAX_ATTRIBUTE = 2**63 - 1  # Toxiproxy's attributes are int64


def make_toxic(
    type_name: str, attributes: Mapping[str, Any] | None = None, base: Toxic | None = None
) -> Toxic:
    """Build a toxic from JSON attributes, validated; ``base`` supplies values not given.

    Raises :class:`ToxicConfigError` naming the type or the attribute that is wrong.
    """
    cls = TOXIC_TYPES.get(type_name) if isinstance(type_name, str) else None
    if cls is None:
        raise ToxicConfigError(
            f"invalid toxic type: {type_name!r} (valid: {', '.join(sorted(TOXIC_TYPES))})"
        )
    if attributes is None:
        attributes = {}
    if not isinstance(attributes, Mapping):
        raise ToxicConfigError("attributes must be a JSON object")
    values: dict[str, int] = base.attributes() if base is not None else {}
    for field in dataclasses.fields(cls):
        if field.name not in attributes:
            continue
        raw = attributes[field.name]
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            raise ToxicConfigError(
                f"{type_name} attribute {field.name!r} must be an integer, got {raw!r}"
            )
        if isinstance(raw, float) and not raw.is_integer():
            raise ToxicConfigError(
                f"{type_name} attribute {field.name!r} must be an integer, got {raw!r}"
            )
        value = int(raw)
        if value < 0:
            raise ToxicConfigError(
                f"{type_name} attribute {field.name!r} must be >= 0, got {value}"
            )
        if value > _MAX_ATTRIBUTE:
            raise ToxicConfigError(f"{type_name} attribute {field.name!r} is too large: {value}")
        values[field.name] = value
    return cls(**values)
