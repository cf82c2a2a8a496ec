"""The HA port is authenticated and bounded: forged, replayed, stale and oversized requests
are refused (and logged with the remote address); the pair itself still works.

Before the cluster secret, a bare CONNECT carrying ``amq-ha-demote`` and a large
``amq-ha-epoch`` demoted a master and overwrote its peer address, and a bare
``amq-ha-replica`` replaced the real slave.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ha_helpers import never_master, wait_for
from hypothesis import given, settings
from hypothesis import strategies as st

import amqtransport
from amqtransport.broker.ha.auth import (
    AUTH_HEADER,
    CHALLENGE_HEADER,
    CHALLENGE_TTL,
    HaRequest,
    RequestSigner,
    RequestVerifier,
    generate_secret,
    load_secret,
)
from amqtransport.errors import ConfigError
from amqtransport.testing.broker_pair import BrokerPair

pytestmark = pytest.mark.timeout(120)

SECRET = b"s3cret-s3cret-s3cret"
DEMOTE, REPLICA = "amq-ha-demote", "amq-ha-replica"


def _headers(kind: str, name: str, epoch: int, ha: str = "127.0.0.1:1") -> dict[str, str]:
    return {kind: name, "amq-ha-epoch": str(epoch), "amq-ha-client": "127.0.0.1:2", "amq-ha-port": ha}


# ---------------------------------------------------------------------- the signature (pure)
def test_signed_request_is_accepted_once() -> None:
    now = 1_000.0  # the receiver's monotonic clock; the sender's clock plays no part
    verifier = RequestVerifier(SECRET)
    h = _headers(DEMOTE, "b", 5)
    h[AUTH_HEADER] = RequestSigner(SECRET).sign(DEMOTE, h, verifier.challenge(now))
    assert verifier.check(DEMOTE, h, now + 1) is None
    again = verifier.check(DEMOTE, h, now + 2)
    assert again is not None and "stale or replayed" in again


def test_ha_request_is_signed_against_the_receivers_challenge() -> None:
    verifier = RequestVerifier(SECRET)
    req = HaRequest(DEMOTE, _headers(DEMOTE, "b", 5), RequestSigner(SECRET))
    assert verifier.check(DEMOTE, req.signed(verifier.challenge(5.0)), 6.0) is None
    assert AUTH_HEADER not in req.signed(None), "no challenge offered: sent unsigned, refused with a reason"
    assert AUTH_HEADER not in HaRequest(DEMOTE, _headers(DEMOTE, "b", 5)).signed("c" * 32)


def test_every_alteration_is_refused() -> None:
    now = 1_000.0
    good = _headers(DEMOTE, "b", 5)
    issuer = RequestVerifier(SECRET)
    challenge = issuer.challenge(now)
    good[AUTH_HEADER] = RequestSigner(SECRET).sign(DEMOTE, good, challenge)

    def fresh(secret: bytes = SECRET) -> RequestVerifier:  # a verifier that issued ``challenge``
        v = RequestVerifier(secret)
        v._issued[challenge] = now + CHALLENGE_TTL
        return v

    for key, value in (("amq-ha-epoch", "6"), ("amq-ha-port", "10.0.0.9:1"), ("amq-ha-client", "x:1"),
                       (DEMOTE, "c")):
        forged = dict(good, **{key: value})
        reason = fresh().check(DEMOTE, forged, now)
        assert reason is not None and "bad cluster secret" in reason, (key, reason)
    # the same headers signed as another request kind
    assert "bad cluster secret" in (fresh().check(REPLICA, {**good, REPLICA: "b"}, now) or "")
    assert "bad cluster secret" in (fresh(b"another-secret-xx").check(DEMOTE, good, now) or "")
    assert "missing" in (fresh().check(DEMOTE, _headers(DEMOTE, "b", 5), now) or "")
    # a challenge this verifier never issued (another node's, or invented), and one answered too late
    assert "stale or replayed" in (RequestVerifier(SECRET).check(DEMOTE, good, now) or "")
    late = fresh().check(DEMOTE, good, now + CHALLENGE_TTL + 1)
    assert late is not None and "stale or replayed" in late
    assert fresh().check(DEMOTE, good, now + CHALLENGE_TTL - 1) is None
    for bad in ("v2:1:2", "v1:" + "c" * 32 + ":abcdefgh:" + "0" * 64, "v2:short:abcdefgh:" + "0" * 64,
                "v2:" + "c" * 32 + ":abc:" + "0" * 64):
        reason = fresh().check(DEMOTE, {**good, AUTH_HEADER: bad}, now)
        assert reason is not None and reason.startswith("malformed amq-ha-auth header"), (bad, reason)


def test_challenges_are_bounded_and_expire() -> None:
    v = RequestVerifier(SECRET, ttl=10.0, max_challenges=3)
    first = v.challenge(0.0)
    later = [v.challenge(1.0) for _ in range(3)]  # the fourth pushes the oldest out
    assert first not in v._issued and all(c in v._issued for c in later)
    v.challenge(20.0)  # the earlier ones have expired by now
    assert len(v._issued) == 1


@given(st.dictionaries(st.sampled_from([AUTH_HEADER, DEMOTE, "amq-ha-epoch", "amq-ha-port", "amq-ha-client"]),
                       st.text(max_size=80)), st.floats(allow_nan=False, allow_infinity=False, width=32))
@settings(deadline=None, max_examples=400)
def test_verifier_fuzz_refuses_without_raising(headers: dict[str, str], now: float) -> None:
    reason = RequestVerifier(SECRET).check(DEMOTE, headers, now)
    assert isinstance(reason, str) and reason


def test_secret_sources_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs the pair's cluster secret"):
        load_secret(None, None)
    with pytest.raises(ConfigError, match="not both"):
        load_secret("x" * 20, str(tmp_path / "f"))
    with pytest.raises(ConfigError, match="at least 16 characters"):
        load_secret("short", None)
    with pytest.raises(ConfigError, match="cannot read it"):
        load_secret(None, str(tmp_path / "missing"))
    f = tmp_path / "secret"
    f.write_text("  " + "k" * 20 + "\n")
    f.chmod(0o600)
    assert load_secret(None, str(f)) == b"k" * 20
    assert len(generate_secret()) >= 40 and generate_secret() != generate_secret()


def test_run_without_a_cluster_secret_is_refused(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "amqtransport", "broker", "run", "--port", "5", "--ha", "replicated",
                          "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "--cluster-password-file" in out.stderr, out.stderr


# ---------------------------------------------------------------------- real processes
def _request(port: int, headers: dict[str, str], raw: bytes | None = None, timeout: float = 5.0) -> bytes:
    """Send one CONNECT (or ``raw`` bytes) and read the answer until the node closes."""
    frame = raw if raw is not None else (
        "CONNECT\naccept-version:1.2\nhost:x\n" + "".join(f"{k}:{v}\n" for k, v in headers.items()) + "\n\x00"
    ).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(frame)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


def _challenge(port: int) -> str:
    """The challenge in the node's answer to a status request (what a signed request answers)."""
    answer = _request(port, {"amq-ha-status": "1"}).decode()
    return next(line.split(":", 1)[1] for line in answer.splitlines() if line.startswith(CHALLENGE_HEADER + ":"))


def _signed(bp: BrokerPair, kind: str, name: str, epoch: int, ha: str, to: int) -> dict[str, str]:
    """A request signed with the pair's secret against a challenge of the node at HA port ``to``."""
    assert bp.cluster_password_file is not None
    secret = bp.cluster_password_file.read_text().strip().encode()
    h = _headers(kind, name, epoch, ha)
    h[AUTH_HEADER] = RequestSigner(secret).sign(kind, h, _challenge(to))
    return h


def test_forged_and_stale_role_requests_are_refused(tmp_path: Path) -> None:
    with BrokerPair("replicated", tmp_path, link_timeout=1.0) as bp:
        with amqtransport.connect(bp.uri) as c:
            c.send("/queue/auth", "one")
        before = json.loads((bp.a.data_dir / "ha-state.json").read_text())
        evil = "127.0.0.1:9"
        # 1. the attack: a bare demote with a huge epoch, on the HA port and on the client port
        for port in (bp.a.ha_port, bp.a.port):
            answer = _request(port, {DEMOTE: "b", "amq-ha-epoch": "999999", "amq-ha-client": evil,
                                     "amq-ha-port": evil})
            assert answer.startswith(b"ERROR") and b"no cluster authentication" in answer, answer
        # 2. a bare replica cannot replace the real slave
        answer = _request(bp.a.ha_port, {REPLICA: "mallory", "amq-ha-epoch": "0", "amq-ha-client": evil,
                                         "amq-ha-port": evil})
        assert answer.startswith(b"ERROR"), answer
        # 3. signed with the right secret but a stale epoch, or claiming an epoch its HA port denies
        answer = _request(bp.a.ha_port, _signed(bp, DEMOTE, "b", 1, f"127.0.0.1:{bp.b.ha_port}", bp.a.ha_port))
        assert b"not newer than ours" in answer, answer
        answer = _request(bp.a.ha_port, _signed(bp, DEMOTE, "b", 7, f"127.0.0.1:{bp.b.ha_port}", bp.a.ha_port))
        assert answer.startswith(b"ERROR") and b"not master at 7" in answer, answer
        # 4. a captured request played again
        replay = _signed(bp, REPLICA, "a", 1, f"127.0.0.1:{bp.a.ha_port}", bp.b.ha_port)
        first = _request(bp.b.ha_port, replay)  # b is a slave: refuses, but its challenge is spent
        assert first.startswith(b"ERROR") and b"not the master" in first, first
        again = _request(bp.b.ha_port, replay)
        assert b"stale or replayed request" in again, again
        # a request signed against the other node's challenge is no good here
        answer = _request(bp.a.ha_port, _signed(bp, DEMOTE, "b", 9, f"127.0.0.1:{bp.b.ha_port}", bp.b.ha_port))
        assert b"stale or replayed request" in answer, answer
        # 5. a request naming the receiver itself
        answer = _request(bp.a.ha_port, _signed(bp, DEMOTE, "a", 9, f"127.0.0.1:{bp.a.ha_port}", bp.a.ha_port))
        assert b"which is this node" in answer, answer
        # nothing moved: a is still master at epoch 1 with b in sync, its state file unchanged
        st_a = bp.a.status()
        assert (st_a["amq-ha-role"], st_a["amq-ha-epoch"], st_a["amq-ha-peer-state"]) == ("master", "1", "in-sync")
        assert json.loads((bp.a.data_dir / "ha-state.json").read_text()) == before
        log = bp.a.log_text()
        assert "HA port: refused demote request from node 'b' from 127.0.0.1:" in log, log[-3000:]
        assert "HA port: refused replication link from node 'mallory' from 127.0.0.1:" in log
        with amqtransport.connect(bp.uri) as c:
            c.send("/queue/auth", "two")
        bp.kill_master()
        assert bp.wait_master(20) is bp.b
        with amqtransport.connect(bp.uri) as c:
            sub = c.subscribe("/queue/auth")
            assert {m.text for m in iter(lambda: sub.receive(timeout=2), None)} == {"one", "two"}


def test_slave_with_another_secret_is_refused_with_clear_logs(tmp_path: Path) -> None:
    other = tmp_path / "other.secret"
    other.write_text(generate_secret())
    other.chmod(0o600)
    bp = BrokerPair("replicated", tmp_path / "pair")
    bp.b.args[bp.b.args.index("--cluster-password-file") + 1] = str(other)
    try:
        bp.a.start()
        bp.wait_master()
        bp.b.start()
        wait_for(lambda: "refused" in bp.b.log_text(), 15, "the slave's refusal log line")
        assert "bad cluster secret" in bp.b.log_text() and "check the cluster secret" in bp.b.log_text()
        assert "refused replication link from node 'b'" in bp.a.log_text()
        assert bp.a.status()["amq-ha-peer-state"] == "none"
        never_master(bp.b, 1.0)
    finally:
        bp.stop()


def test_ha_port_limits(tmp_path: Path) -> None:
    cfg = tmp_path / "limits.toml"
    cfg.write_text("[ha]\nha_max_connections = 4\nha_idle_timeout = 0.5\nha_max_frame = 2048\n")
    with BrokerPair("replicated", tmp_path / "pair", extra_args=["--config", str(cfg)]) as bp:
        port = bp.a.ha_port
        # idle: a connection that never sends its request is closed with a reason
        answer = _request(port, {}, raw=b"")
        assert answer.startswith(b"ERROR") and b"no CONNECT frame within 0.5 s" in answer, answer
        # oversized: a request above ha_max_frame is refused
        answer = _request(port, {}, raw=b"CONNECT\namq-ha-status:1\nx:" + b"y" * 4000 + b"\n\n\x00")
        assert answer.startswith(b"ERROR") and b"malformed frame" in answer, answer
        # the cap: 4 connections wait for their request, the fifth is closed at once
        held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(4)]
        try:
            time.sleep(0.1)
            t0 = time.monotonic()
            answer = _request(port, {}, raw=b"")  # (a request written now could meet a closed socket: RST)
            assert answer.startswith(b"ERROR") and b"too many connections" in answer, answer
            assert time.monotonic() - t0 < 0.4, "the extra connection was not refused at once"
        finally:
            for s in held:
                s.close()
        time.sleep(0.2)
        assert bp.a.status()["amq-ha-role"] == "master"
        log = bp.a.log_text()
        assert "HA port: refused a connection from 127.0.0.1:" in log and "(limit)" in log
        assert bp.b.status()["amq-ha-peer-state"] == "in-sync", "the replication link is not counted"


def test_shared_store_nodes_take_no_role_requests(tmp_path: Path) -> None:
    with BrokerPair("shared-store", tmp_path, lock_interval=0.05) as bp:
        answer = _request(bp.a.ha_port, {DEMOTE: "b", "amq-ha-epoch": "99", "amq-ha-port": "127.0.0.1:9"})
        assert answer.startswith(b"ERROR") and b"shared-store pair" in answer, answer
        assert bp.a.status()["amq-ha-role"] == "master"
