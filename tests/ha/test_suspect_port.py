"""A suspect master does not accept client TCP, so clients come back as soon as it serves again.

Real processes: a replicated pair; the slave is frozen (SIGSTOP) until the master drops
it and holds every receipt (suspect: it cannot tell a frozen slave from one that took
over). Before the fix the suspect master's client port accepted TCP and ERRORed each
CONNECT: a client's probe saw the port accept, the attempt it cut short failed, and the
probe was off for the (doubled) wait that followed, so clients came back long after
the slave was thawed and the master served again (the issue measured up to 25.6 s).
Now the port is closed while receipts are held and reopened when they resume: every
probe is refused meanwhile and the first one after the reopening connects. The
WebSocket port (``--ws``) closes and reopens with it.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from ha_helpers import frozen, refuses, wait_for, with_opts

import amqtransport
from amqtransport.testing.broker_pair import BrokerPair
from amqtransport.testing.ports import free_port

pytestmark = pytest.mark.timeout(180)

#: clients with different first delays, so that their back-off passes are out of step
FIRST_DELAYS_MS = (10, 13, 17, 23)
#: a client must be back this soon after the master serves again (the issue asks 1 s;
#: slack for a shared, loaded machine; before the fix: several seconds)
BACK_WITHIN_S = 2.0


def test_clients_return_soon_after_a_suspect_master_serves_again(tmp_path: Path) -> None:
    ws = {"a": free_port(), "b": free_port()}
    with BrokerPair("replicated", tmp_path, link_timeout=1.0, master_args=["--ws", f"127.0.0.1:{ws['a']}"],
                    slave_args=["--ws", f"127.0.0.1:{ws['b']}"]) as bp:
        master = bp.wait_master(30)
        slave = bp.other(master)
        assert not refuses(ws[master.name]), "the master's WebSocket port is open"
        wait_for(lambda: master.status().get("amq-ha-peer-state") == "in-sync", 30, "the slave to sync")
        conns = [amqtransport.connect(with_opts(bp.uri, f"initialReconnectDelay={d}")) for d in FIRST_DELAYS_MS]
        done_at: dict[int, float] = {}
        try:
            for i, c in enumerate(conns):
                c.send("/queue/suspect", f"warm-up-{i}")

            def send(i: int) -> None:
                conns[i].send("/queue/suspect", f"held-{i}")
                done_at[i] = time.monotonic()

            with frozen(slave):
                threads = [threading.Thread(target=send, args=(i,), daemon=True) for i in range(len(conns))]
                for t in threads:
                    t.start()
                wait_for(lambda: "amq-ha-suspect" in master.status(), 15, "the master to drop the frozen slave")
                # the held receipts' clients are cut and keep trying: the port refuses them
                wait_for(lambda: refuses(master.port), 5, "the suspect master to close its client port")
                time.sleep(10)  # long enough for a growing back-off
                assert not done_at, f"receipted while the peer could not be asked to stand by: {done_at}"
                assert refuses(master.port), "a suspect master accepts client connections"
                assert refuses(ws[master.name]), "a suspect master accepts WebSocket connections"
            wait_for(lambda: "amq-ha-suspect" not in master.status(), 30, "the master to serve again")
            serving_at = time.monotonic()
            wait_for(lambda: not refuses(ws[master.name]), 5, "the WebSocket port to reopen with the client port")
            for t in threads:
                t.join(40)
        finally:
            for c in conns:
                c.close()
        late = {i: round(done_at[i] - serving_at, 2) for i in done_at}
        assert len(done_at) == len(conns), f"sends never receipted: {set(range(len(conns))) - set(done_at)}"
        assert max(late.values()) < BACK_WITHIN_S, f"clients back this long after the master served again: {late}"
