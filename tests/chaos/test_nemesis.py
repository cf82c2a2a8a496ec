"""The nemesis on real processes: a short run per HA mode passes, Ctrl-C stops everything,
the tmpfs full-disk plumbing works, and the command line refuses bad input.

``test_short_nemesis_both_modes`` is the README's short nemesis: two rounds per mode
(seed 678: replicated, a half-open replication link, a freeze, client-link cuts and a
full disk on the master; shared store, a SIGKILL of the master with a kernel client
partition alongside, full disks and a half-open client link), under a minute per mode. The long run
is ``amq chaos run nemesis --rounds 200 --mode both`` (chaos/README.md).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from amqtransport.cli.main import cli
from amqtransport.processes.disk import TmpfsUnavailable
from chaos.nemesis import netns
from chaos.nemesis.checker import Violation, check
from chaos.nemesis.cli import run_nemesis
from chaos.nemesis.cluster import TmpfsMount
from chaos.nemesis.history import Delivery, History, RoundRecord, Send, Subscriber, load_history
from chaos.nemesis.results import ModeResult, RoundOutcome
from chaos.nemesis.runner import NemesisParams
from chaos.nemesis.schedule import plan_round

pytestmark = [pytest.mark.chaos]

# the seed's two rounds per mode hold every fault family the assertions below name
# (chaos.nemesis.schedule.plan_rounds; a new default fault kind reshuffles the plans)
SEED = 678


@pytest.mark.timeout(420)
def test_short_nemesis_both_modes(tmp_path: Path) -> None:
    lines: list[str] = []

    def echo(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    code = run_nemesis("both", NemesisParams(rounds=2, seed=SEED), report_dir=tmp_path / "report", echo=echo,
                       workdir=tmp_path)
    text = "\n".join(lines)
    assert code == 0, text
    data = json.loads((tmp_path / "report" / "report.json").read_text())
    assert data["ok"] and data["seed"] == SEED and data["modes"] == ["replicated", "shared-store"]
    for mode in ("replicated", "shared-store"):
        result = data["results"][mode]
        assert result["ok"] and len(result["rounds"]) == 2, result["rounds"]
        assert all(r["healthy"] for r in result["rounds"])
        assert [r["seed"] for r in result["rounds"]][0] == SEED
        assert f"nemesis[{mode}] round 2/2 seed" in text
        history = load_history(tmp_path / "report" / "report.json", mode)
        kinds = {f.kind for f in history.faults}
        # a master lost (killed, or frozen past the takeover since freeze-master joined the
        # default set) and a client link hurt
        assert kinds & {"kill-master", "freeze-master"} and kinds & {"cut-client", "half-open-client", "latency"}, kinds
        if mode == "replicated" and TmpfsMount.unavailable_reason() is None:
            assert "disk-full" in kinds and "cut-replication" in kinds, kinds
        assert all(not f.detail.startswith(("skipped", "failed")) for f in history.faults if f.kind == "kill-master")
        # every kind of client did its work, and the checker agrees offline
        stats = check(history).stats
        assert stats["sends_rcpt_ok"] > 200 and stats["txs_committed"] > 20 and stats["sends_ff_none"] > 50
        assert stats["acks_confirmed"] > 100 and stats["probes"] > 100
        got = {d.sub for d in history.deliveries if d.stage == "app"}
        assert got == {s.name for s in history.subscribers} | {"c-group1", "c-group2", "c-group3"}, got
        # the ActiveMQ features were exercised and judged (chaos/nemesis/feature_rules.py)
        assert stats["scheduled_delivered"] > 20 and stats["priority_pairs_checked"] > 100, stats
        assert stats["group_messages"] > 50, stats
        # hits through a backlog of misses deeper than the nemesis's page_window (100), the misses drained
        assert stats["selector_hits_delivered"] >= 5 and stats["selector_misses_drained"] > 100, stats
        assert check(history).ok
        # the harness recorded when it stopped the producers (availability counts no window after it)
        stopped = history.meta["workload_stopped_s"]
        assert max(r.t_end for r in history.rounds) <= stopped <= history.t_end
    assert f"replay with: amq chaos run nemesis --mode both --seed {SEED} --rounds 2" in text
    assert list(tmp_path.glob("amq-chaos-*")) == []  # a passing run leaves no scratch directory


def _descendants(pid: int) -> set[int]:
    out: set[int] = set()
    todo = [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for c in map(int, children):
                if c not in out:
                    out.add(c)
                    todo.append(c)
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.timeout(180)
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs /proc to find the child processes")
def test_ctrl_c_stops_every_process_and_unmounts(tmp_path: Path) -> None:
    env = dict(os.environ, TMPDIR=str(tmp_path), PYTHONUNBUFFERED="1")
    # a long freeze early in round 1, so Ctrl-C lands while a node is SIGSTOPped
    kinds = ["freeze-master", "kill-master", "restart-dead"]
    seed = next(s for s in range(1000) if (first := plan_round(s, "shared-store", kinds).steps[0]).kind
                == "freeze-master" and first.hold > 3.0)
    proc = subprocess.Popen(
        [sys.executable, "-m", "amqtransport", "chaos", "run", "nemesis", "--rounds", "50", "--mode",
         "shared-store", "--seed", str(seed), "--faults", ",".join(kinds)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
        # started as a non-interactive shell starts a background job: SIGINT ignored;
        # Ctrl-C (kill -INT) must stop the run all the same
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    children: set[int] = set()
    try:
        assert proc.stdout is not None
        seen: list[str] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            seen.append(line)
            if "workload running" in line or not line:
                break
        assert "workload running" in seen[-1], "".join(seen)
        plan = plan_round(seed, "shared-store", kinds)
        time.sleep(plan.steps[0].at + 1.0)  # inside the freeze
        children = _descendants(proc.pid)
        assert len(children) >= 3, children  # two pair nodes and the spoke
        mounted = _mounts_under(tmp_path)
        namespaces = _namespaces_of(proc.pid)
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    finally:
        _reap(proc, children | _descendants(proc.pid), tmp_path)
    out = "".join(seen) + rest
    try:
        assert proc.returncode == 130, out
        assert "interrupted; stopping every process and unmounting" in out
        assert [p for p in children if _alive(p)] == [], out
        assert _mounts_under(tmp_path) == []  # the tmpfs and the LazyFS (FUSE) mounts
        if TmpfsMount.unavailable_reason() is None:
            assert mounted, "the shared store was on a tmpfs while it ran"
        assert _namespaces_of(proc.pid) == []
        if netns.unavailable_reason() is None:
            assert len(namespaces) == 3, namespaces  # the two nodes' and the switch's
    finally:  # whatever the nemesis left behind (a failed test) must not outlive the test
        _reap(proc, children, tmp_path)
        for target in _mounts_under(tmp_path):
            subprocess.run(["umount", "-l", target], check=False)


def _namespaces_of(pid: int) -> list[str]:
    """The network namespaces the nemesis process ``pid`` made (chaos/nemesis/netns.py)."""
    if shutil.which("ip") is None:
        return []
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(f"{netns.NS_PREFIX}{pid}x")]


def _mounts_under(path: Path) -> list[str]:
    return [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines() if str(path) in line]


def _reap(proc: subprocess.Popen[str], pids: set[int], marker: Path) -> None:
    """Ctrl-C first (the nemesis cleans up), then SIGKILL, by pid, what is left of ours
    (a pid whose command line names our scratch directory ``marker``)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for pid in pids:
        try:
            ours = str(marker) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if ours and _alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_tmpfs_mount_fill_drain_unmount(tmp_path: Path) -> None:
    reason = TmpfsMount.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    m = TmpfsMount(tmp_path / "disk", 4)
    try:
        m.mount()
    except TmpfsUnavailable as exc:
        pytest.skip(f"mounting a tmpfs is not allowed here: {exc}")
    try:
        (m.path / "journal").write_bytes(b"x" * 1000)
        written = m.fill()
        assert 3 * 2**20 < written <= 4 * 2**20
        with pytest.raises(OSError, match="No space left"):
            (m.path / "more").write_bytes(b"y" * 8192)
        m.drain()
        (m.path / "more").write_bytes(b"y" * 8192)  # room again
    finally:
        m.unmount()
    assert not m.mounted and str(m.path) not in Path("/proc/mounts").read_text()


# -- the command line -----------------------------------------------------------------

def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["chaos", "run", *args])
    return result.exit_code, result.output


def test_cli_refuses_a_mode_without_a_pair(tmp_path: Path) -> None:
    code, out = _cli("nemesis", "--mode", "single", "--rounds", "1")
    assert code == 2 and "the nemesis runs on our HA pair" in out


def test_cli_refuses_unknown_fault_kinds() -> None:
    code, out = _cli("nemesis", "--faults", "kill-master,unplug")
    assert code == 2 and "unknown fault kind(s) unplug" in out


def test_cli_nemesis_options_belong_to_the_nemesis() -> None:
    code, out = _cli("kill-master", "--seed", "3")
    assert code == 2 and "options of the nemesis" in out
    code, out = _cli("nemesis", "kill-master")
    assert code == 2 and "run the nemesis on its own" in out
    code, out = _cli("kill-master", "--witness")
    assert code == 2 and "--witness" in out and "options of the nemesis" in out


def test_cli_list_shows_the_fault_kinds() -> None:
    code, out = _cli("--list")
    assert code == 0
    assert "nemesis fault kinds" in out and "freeze-master" in out and "delete-lock" in out


def test_cli_help_documents_the_nemesis() -> None:
    code, out = _cli("--help")
    assert code == 0
    for word in ("nemesis", "--seed", "--faults", "--report", "--rounds", "Ctrl-C"):
        assert word in out


class _ScriptedRun:
    """A mode run that 'ran' two rounds, the second losing a receipted message."""

    def __init__(self, mode: str, params: NemesisParams, workdir: Path, echo: object, clock: object) -> None:
        h = History({"mode": mode})
        h.extend([Subscriber("c", "/queue/q", "client-individual"),
                  RoundRecord(1, params.seed, mode, 0.0, 10.0, "+1.0s kill-master", True, 1.0),
                  RoundRecord(2, 777, mode, 10.0, 20.0, "+1.0s latency", True, 0.2),
                  Send(1.0, "p", "/queue/q", "k1", "rcpt", "ok", 1.1),
                  Delivery(1.2, "c", "k1", "m1", 1, "app"),
                  Send(12.0, "p", "/queue/q", "k2", "rcpt", "ok", 12.1)])
        self.result = ModeResult(mode, params, ["kill-master", "latency"], h)
        self.result.rounds = [RoundOutcome(mode, n, seed, plan_round(seed, mode, None, round_no=n), healthy=True)
                              for n, seed in ((1, params.seed), (2, 777))]

    def run(self) -> ModeResult:
        self.result.result = check(self.result.history)
        return self.result


def test_a_failing_round_prints_its_seed_and_the_replay_command(tmp_path: Path) -> None:
    lines: list[str] = []
    code = run_nemesis("replicated", NemesisParams(rounds=2, seed=5), report_dir=tmp_path / "r", echo=lines.append,
                       workdir=tmp_path, mode_runner=_ScriptedRun)
    text = "\n".join(lines)
    assert code == 1
    assert "FAILED replicated round 2: seed 777; replay: amq chaos run nemesis --mode replicated --seed 777 " \
           "--rounds 1" in text
    assert "lost: k2 to /queue/q" in text and "FAILED replicated round 1" not in text
    data = json.loads((tmp_path / "r" / "report.json").read_text())
    assert not data["ok"] and data["results"]["replicated"]["check"]["counts"]["lost"] == 1
    assert "broker logs and data kept in" in text


def test_with_the_witness_the_replay_commands_carry_it(tmp_path: Path) -> None:
    lines: list[str] = []
    code = run_nemesis("replicated", NemesisParams(rounds=2, seed=5, witness=True), report_dir=tmp_path / "r",
                       echo=lines.append, workdir=tmp_path, mode_runner=_ScriptedRun)
    text = "\n".join(lines)
    assert code == 1
    assert "replay with: amq chaos run nemesis --mode replicated --seed 5 --rounds 2 --witness" in text
    assert "replay: amq chaos run nemesis --mode replicated --seed 777 --rounds 1 --witness" in text


class _LateRun:
    """A mode run whose first round ended with two receipted messages undelivered (both
    delivered in round 2) and whose second ended with one that never came."""

    def __init__(self, mode: str, params: NemesisParams, workdir: Path, echo: object, clock: object) -> None:
        h = History({"mode": mode})
        h.extend([Subscriber("c", "/queue/q", "client-individual"), Subscriber("d", "/queue/q", "client-individual"),
                  RoundRecord(1, params.seed, mode, 0.0, 10.0, "+1.0s kill-master", True, 1.0),
                  RoundRecord(2, 777, mode, 10.0, 20.0, "+1.0s latency", True, 0.2),
                  Send(1.0, "p", "/queue/q", "k1", "rcpt", "ok", 1.1),
                  Send(2.0, "p", "/queue/q", "k2", "rcpt", "ok", 2.1),
                  Delivery(12.0, "c", "k1", "m1", 1, "wire"),  # the consumer's application never got it
                  Delivery(12.5, "d", "k1", "m1", 2, "app"),
                  Delivery(13.0, "c", "k2", "m2", 1, "app"),
                  Send(14.0, "p", "/queue/q", "k3", "rcpt", "ok", 14.1)])
        self.result = ModeResult(mode, params, ["kill-master", "latency"], h)
        self.result.rounds = [
            RoundOutcome(mode, 1, params.seed, plan_round(params.seed, mode, None, round_no=1), healthy=True,
                         pending=2, late=[("k1", ("c", "d")), ("k2", ("c", "d"))], stacks="/tmp/threads.txt",
                         violations=[Violation("scheduled-late", 9.0, 1, "k1 due by 5.0, not delivered (so far)")]),
            RoundOutcome(mode, 2, 777, plan_round(777, mode, None, round_no=2), healthy=True,
                         pending=1, late=[("k3", ("c", "d"))]),
        ]

    def run(self) -> ModeResult:
        self.result.result = check(self.result.history)
        return self.result


def test_the_summary_says_which_late_messages_came_later_and_which_never(tmp_path: Path) -> None:
    """A round that ends with receipted messages undelivered is named with what became of
    them (before: "N receipted messages not delivered", also for those drained later)."""
    lines: list[str] = []
    run_nemesis("replicated", NemesisParams(rounds=2, seed=5), report_dir=tmp_path / "r", echo=lines.append,
                workdir=tmp_path, mode_runner=_LateRun)
    text = "\n".join(lines)
    assert ("replicated round 1: 2 receipted messages still undelivered at the round's end "
            "(thread stacks then: /tmp/threads.txt): all 2 delivered later") in text, text
    assert "replicated round 2: 1 receipted message still undelivered at the round's end: 0 delivered later, " \
           "1 never: k3" in text, text
    assert "not delivered" not in text
    # the round's quick look suspected k1 late; the final check (k1 has no delay) does not
    assert "replicated round 1: suspected scheduled-late in the round's quick look; the final check of the whole " \
           "history does not confirm it" in text, text
    assert "round 2: suspected" not in text
    data = json.loads((tmp_path / "r" / "report.json").read_text())
    assert data["results"]["replicated"]["rounds"][0]["late"] == [["k1", ["c", "d"]], ["k2", ["c", "d"]]]


@pytest.mark.soak
@pytest.mark.timeout(0)  # as long as the rounds take (about 15 s each per mode)
def test_nemesis_soak(tmp_path: Path) -> None:
    """The long nemesis as a test (``-m soak``): ``NEMESIS_ROUNDS`` rounds per mode (20),
    ``NEMESIS_SEED`` (random, printed). The benchmark-style figures come from
    ``amq chaos run nemesis --rounds 200 --mode both --report out/`` (docs/chaos.md)."""
    from chaos.nemesis.cli import random_seed

    rounds = int(os.environ.get("NEMESIS_ROUNDS", "20"))
    seed = int(os.environ.get("NEMESIS_SEED", "0")) or random_seed()
    code = run_nemesis("both", NemesisParams(rounds=rounds, seed=seed), report_dir=tmp_path / "report",
                       echo=lambda line: print(line, flush=True), workdir=tmp_path)
    assert code == 0, f"seed {seed}: see the lines above and {tmp_path / 'report' / 'report.json'}"
