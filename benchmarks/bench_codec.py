"""Codec throughput: parse and serialize 100k small frames, print frames/s.

Run: .venv/bin/python benchmarks/bench_codec.py [N]
Not a test: numbers depend on the machine (and on other load on it).
"""

from __future__ import annotations

import sys
import time

from amqtransport.stomp import Frame, FrameParser, Heartbeat, serialize


def main(n: int = 100_000) -> None:
    frames = [
        Frame.make(
            "MESSAGE",
            {
                "destination": "/queue/bench",
                "message-id": f"ID:bench-{i}",
                "subscription": "0",
                "ack": f"ack-{i}",
                "amq-idempotency-key": f"key-{i}",
            },
            b"x" * 100,
        )
        for i in range(n)
    ]

    t0 = time.perf_counter()
    chunks = [serialize(f) for f in frames]
    t1 = time.perf_counter()
    data = b"".join(chunks)
    print(f"serialize: {n / (t1 - t0):,.0f} frames/s  ({len(data) / (t1 - t0) / 1e6:.1f} MB/s)")

    for label, size in (("parse (one buffer)", len(data)), ("parse (4 KiB chunks)", 4096), ("parse (64 B chunks)", 64)):
        parser = FrameParser()
        count = 0
        t0 = time.perf_counter()
        for i in range(0, len(data), size):
            parser.feed(data[i : i + size])
            for _ in parser.events():
                count += 1
        t1 = time.perf_counter()
        assert count == n, count
        print(f"{label}: {n / (t1 - t0):,.0f} frames/s  ({len(data) / (t1 - t0) / 1e6:.1f} MB/s)")

    body = bytes(range(1, 256)) * 4112
    big = serialize(Frame.make("SEND", {"destination": "/queue/big"}, body)).replace(b"content-length", b"x-length")
    for label, payload in (("1 MiB body, content-length", serialize(Frame.make("SEND", {}, body))), ("1 MiB body, NUL-terminated", big)):
        parser = FrameParser()
        t0 = time.perf_counter()
        got: list[Frame | Heartbeat] = []
        for i in range(0, len(payload), 4096):
            parser.feed(payload[i : i + 4096])
            got.extend(parser.events())
        t1 = time.perf_counter()
        assert len(got) == 1
        print(f"{label} in 4 KiB chunks: {(t1 - t0) * 1000:.1f} ms")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000)
