"""How a node probes its peer's addresses (ha/wire.py ``ask_peer``), on real sockets.

A slave that loses its master probes every address it knows for it (the HA port, the
client port, the master connector) before it asks the witness. A frozen master's
kernel still accepts connections but nothing answers, so each probe lasts its whole
timeout: probed one after the other, two addresses cost the slave 2 s before the
witness was asked (the nemesis, issue 24: 'replication link silent' then the takeover
2.0 s later, in every freeze-master and isolate-node round). Status probes now go to
every address at once; the answers keep their order, and one that settles the question
(e.g. a master answering) ends the wait for the others.
"""

from __future__ import annotations

import asyncio
import select
import socket
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from amqtransport.broker.ha.wire import ask_peer
from amqtransport.testing.ports import free_port


@contextmanager
def _silent_listeners(n: int) -> Iterator[list[socket.socket]]:
    """``n`` listening sockets that never accept: connections complete in the kernel and
    nothing ever answers (a SIGSTOPped node's ports)."""
    with ExitStack() as stack:
        socks = []
        for _ in range(n):
            s = stack.enter_context(socket.socket())
            s.bind(("127.0.0.1", free_port()))
            s.listen(8)
            socks.append(s)
        yield socks


def _pending(s: socket.socket) -> bool:
    """A connection waits in ``s``'s accept queue."""
    return bool(select.select([s], [], [], 0)[0])


def test_status_probes_of_a_silent_peer_go_to_every_address_at_once() -> None:
    """Before, the second address was probed only once the first had timed out (here 30
    s: the test gave up waiting for a connection to the second address)."""
    with _silent_listeners(2) as socks:
        addresses = [s.getsockname()[:2] for s in socks]

        async def main() -> bool:
            task = asyncio.ensure_future(ask_peer(addresses, None, 30.0))
            try:
                for _ in range(400):  # up to 20 s on a loaded machine; both at once takes milliseconds
                    if all(_pending(s) for s in socks):
                        return True
                    await asyncio.sleep(0.05)
                return False
            finally:
                task.cancel()

        assert asyncio.run(main()), "the second address was not probed while the first one was silent"


def test_a_master_answering_on_the_first_address_ends_the_probe_and_order_is_kept() -> None:
    """The first address answers as master at once, the second never answers: the probe
    returns with the first's answer without waiting out the second's timeout."""

    async def main() -> list[str]:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\x00")
            writer.write(b"CONNECTED\nversion:1.2\namq-ha-role:master\namq-ha-name:a\n\n\x00")
            await writer.drain()
            writer.close()

        port = free_port()
        server = await asyncio.start_server(answer, "127.0.0.1", port)
        async with server:
            with _silent_listeners(1) as (silent,):
                got = await asyncio.wait_for(
                    ask_peer([("127.0.0.1", port), silent.getsockname()[:2]], None, 30.0,
                             until=lambda a: a.info is not None and a.info.get("amq-ha-role") == "master"),
                    20.0)
        assert len(got) == 1 and got[0].address == ("127.0.0.1", port), got
        return [a.info.get("amq-ha-name", "") if a.info else "" for a in got]

    assert asyncio.run(main()) == ["a"]
