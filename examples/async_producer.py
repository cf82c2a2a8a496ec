"""An asyncio producer that sends through a master kill and loses nothing.

    python examples/async_producer.py 'failover:(tcp://127.0.0.1:61613,tcp://127.0.0.1:61614)?randomize=false' \
        /queue/orders --count 20000 --tasks 20 --rate 2000

``--tasks`` tasks share one connection; each message body is ``seq:N`` so the consumer
(examples/async_consumer.py) can check that every number arrived once. Each ``send``
returns once the broker's receipt is in, so a number printed as sent is on the broker's
disk (and on its slave's, in a replicated pair). Kill the master while it runs
(``kill -9 <pid printed by amq broker pair>``): the connection fails over, replays what
was not receipted, and the sends go on. Ctrl-C stops cleanly (the sends in flight are
waited for). Exit status 0 when every message was receipted.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

import amqtransport.aio as aio
from amqtransport.errors import AmqTransportError


class Progress:
    """Prints a line every second: sent so far, rate, failovers."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.sent = 0
        self.started = time.monotonic()

    def line(self, conn: aio.AsyncConnection) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        return (f"sent {self.sent}/{self.total} ({self.sent / elapsed:.0f}/s), connected to "
                f"{conn.connected_uri or '(reconnecting)'}, failovers {conn.transport.reconnects}")


class Listener:
    def on_interrupted(self, error: BaseException) -> None:
        print(f"link lost: {error}; failing over (unreceipted sends will be replayed)", flush=True)

    async def on_resumed(self, address: str) -> None:
        print(f"resumed on {address}", flush=True)


async def produce(uri: str, destination: str, count: int, tasks: int, rate: float) -> int:
    progress = Progress(count)
    numbers = iter(range(count))
    async with aio.connect(uri, listener=Listener()) as conn:
        print(f"connected to {conn.connected_uri}; sending {count} messages to {destination} "
              f"from {tasks} tasks", flush=True)

        async def worker() -> None:
            for n in numbers:  # one shared iterator: each number is sent by one task
                if rate:  # pace the whole producer at about `rate` messages per second
                    await asyncio.sleep(max(0.0, progress.started + n / rate - time.monotonic()))
                await conn.send(destination, f"seq:{n}")
                progress.sent += 1

        async def report() -> None:
            while True:
                await asyncio.sleep(1.0)
                print(progress.line(conn), flush=True)

        reporter = asyncio.create_task(report())
        try:
            await asyncio.gather(*(worker() for _ in range(tasks)))
        finally:
            reporter.cancel()
        print(progress.line(conn), flush=True)
    return progress.sent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("uri")
    parser.add_argument("destination")
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--tasks", type=int, default=20, help="tasks sharing the one connection")
    parser.add_argument("--rate", type=float, default=0.0, help="messages per second (0: as fast as receipts come)")
    args = parser.parse_args()
    try:
        sent = asyncio.run(produce(args.uri, args.destination, args.count, args.tasks, args.rate))
    except KeyboardInterrupt:
        print("interrupted: stopped (every send that returned was receipted)", flush=True)
        return 130
    except AmqTransportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"done: {sent} receipted", flush=True)
    return 0 if sent == args.count else 1


if __name__ == "__main__":
    sys.exit(main())
