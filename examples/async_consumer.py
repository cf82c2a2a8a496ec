"""An asyncio service that consumes, processes and acknowledges through a master kill.

    python examples/async_consumer.py 'failover:(tcp://127.0.0.1:61613,tcp://127.0.0.1:61614)?randomize=false' \
        /queue/orders --expect 20000

It subscribes with ``ack="client-individual"``, "processes" each ``seq:N`` message
(here: records N; ``--work-ms`` simulates work) and acknowledges it only after
processing, so a message whose processing a failover interrupted is redelivered, and
the client's duplicate filter drops copies the application already has. It stops
after ``--expect`` distinct messages (or ``--idle`` seconds with nothing new, or
Ctrl-C) and reports what arrived: numbers missing, copies dropped. Exit status 0 when
all ``--expect`` numbers arrived, each once.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

import amqtransport.aio as aio
from amqtransport.errors import AmqTransportError


class Tally:
    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.twice = 0

    def record(self, text: str) -> None:
        n = int(text.removeprefix("seq:"))
        if n in self.seen:
            self.twice += 1
        self.seen.add(n)


async def consume(uri: str, destination: str, expect: int, idle: float, work_ms: float) -> Tally:
    tally = Tally()
    async with aio.connect(uri) as conn:
        conn.add_listener(Listener())
        sub = await conn.subscribe(destination, ack="client-individual")
        print(f"connected to {conn.connected_uri}; consuming {destination}", flush=True)
        last_report = time.monotonic()
        while len(tally.seen) < expect:
            msg = await sub.receive(timeout=idle)
            if msg is None:
                print(f"nothing new for {idle} s: stopping", flush=True)
                break
            if work_ms:
                await asyncio.sleep(work_ms / 1000)  # the "processing"
            tally.record(msg.text)
            await msg.ack()  # after processing: at-least-once, made exactly-once by the filter
            if time.monotonic() - last_report >= 1.0:
                last_report = time.monotonic()
                print(f"received {len(tally.seen)}/{expect}, copies dropped by the duplicate filter "
                      f"{conn.duplicates}, connected to {conn.connected_uri or '(reconnecting)'}", flush=True)
        print(f"copies dropped by the duplicate filter: {conn.duplicates}", flush=True)
    return tally


class Listener:
    def on_interrupted(self, error: BaseException) -> None:
        print(f"link lost: {error}; failing over (the subscription is replayed)", flush=True)

    def on_resumed(self, address: str) -> None:
        print(f"resumed on {address}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("uri")
    parser.add_argument("destination")
    parser.add_argument("--expect", type=int, default=10_000, help="distinct messages to wait for")
    parser.add_argument("--idle", type=float, default=30.0, help="stop after this many seconds with nothing new")
    parser.add_argument("--work-ms", type=float, default=0.0, help="simulated processing time per message")
    args = parser.parse_args()
    try:
        tally = asyncio.run(consume(args.uri, args.destination, args.expect, args.idle, args.work_ms))
    except KeyboardInterrupt:
        print("interrupted: stopped (unacknowledged messages stay on the broker)", flush=True)
        return 130
    except AmqTransportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    missing = sorted(set(range(args.expect)) - tally.seen)
    print(f"done: {len(tally.seen)} distinct, {len(missing)} missing"
          + (f" (first: {missing[:10]})" if missing else "") + f", {tally.twice} seen twice", flush=True)
    return 0 if not missing and tally.twice == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
