"""A replicated pair whose nodes' wall clocks disagree by five minutes works as one with
agreeing clocks: HA requests are made fresh by the receiver's challenge, not by
comparing clocks (broker/ha/auth.py).

Node ``b`` runs under Debian's libfaketime (``LD_PRELOAD``, ``FAKETIME=-300s``: its
``time.time()`` is five minutes behind ``a``'s). Before the challenge, the slave's
signed replication request was refused ("request time is -300 s off this node's
clock"): the pair never came into sync, and after a takeover the old master could not
rejoin.
"""

from __future__ import annotations

import glob
import time
from pathlib import Path

import pytest
from ha_helpers import wait_for

import amqtransport
from amqtransport.testing.broker_pair import BrokerPair

pytestmark = pytest.mark.timeout(120)

LIBFAKETIME = next(iter(sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))), None)


@pytest.mark.skipif(LIBFAKETIME is None, reason="Debian's faketime is not installed (scripts/setup.sh installs it as root)")
def test_a_pair_with_clocks_five_minutes_apart_syncs_and_fails_over(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    assert LIBFAKETIME is not None
    bp = BrokerPair("replicated", tmp_path, link_timeout=1.0)
    try:
        bp.a.start()
        bp.wait_master()
        # only b's process (and what it starts) sees the skewed clock; monotonic time is left alone
        monkeypatch.setenv("LD_PRELOAD", LIBFAKETIME)
        monkeypatch.setenv("FAKETIME", "-300s")
        monkeypatch.setenv("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        monkeypatch.setenv("FAKETIME_NO_CACHE", "1")
        bp.b.start()
        monkeypatch.delenv("LD_PRELOAD")
        # b's replication request (signed with its clock) is accepted by a: b comes into sync
        wait_for(lambda: bp.a.status().get("amq-ha-peer-state") == "in-sync", 20,
                 f"b in sync with a; b's log:\n{bp.b.log_text()[-2000:]}")
        sent = []
        with amqtransport.connect(bp.uri) as c:
            for i in range(50):
                c.send("/queue/skew", f"m{i}")
                sent.append(f"m{i}")
        # the link blip of the issue, as a takeover: a dies, b (the skewed one) takes over ...
        bp.a.kill()
        assert bp.wait_master(20) is bp.b
        with amqtransport.connect(bp.uri) as c:
            for i in range(50, 80):
                c.send("/queue/skew", f"m{i}")
                sent.append(f"m{i}")
        # ... and a, restarted, is accepted by b as its slave (a's request, b's challenge)
        t0 = time.monotonic()
        bp.a.start()
        wait_for(lambda: bp.b.status().get("amq-ha-peer-state") == "in-sync", 20,
                 f"a in sync with b; a's log:\n{bp.a.log_text()[-2000:]}")
        assert time.monotonic() - t0 < 20
        for node in (bp.a, bp.b):
            assert "HA port: refused" not in node.all_logs(), node.all_logs()[-2000:]
        with amqtransport.connect(bp.uri) as c:
            sub = c.subscribe("/queue/skew")
            got = [m.text for m in iter(lambda: sub.receive(timeout=2), None)]
        assert sorted(got) == sorted(sent)
    finally:
        bp.stop()
