"""benchmarks/run_all.py and benchmarks/_common.py: results are collected per benchmark,
failures and timeouts are reported (and a timed-out benchmark is killed), and the helpers
compute what they say."""

from __future__ import annotations

import json
import math
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    results = tmp_path / "results"
    monkeypatch.setenv("AMQ_BENCH_RESULTS", str(results))
    monkeypatch.syspath_prepend(str(BENCH_DIR))
    for mod in ("_common", "run_all"):
        sys.modules.pop(mod, None)
    import run_all

    assert run_all.RESULTS_DIR == results
    yield run_all
    for mod in ("_common", "run_all"):
        sys.modules.pop(mod, None)


def script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"bench_{name}.py"
    path.write_text(
        f"import sys\nsys.path.insert(0, {str(BENCH_DIR)!r})\n" + textwrap.dedent(body), encoding="utf-8"
    )
    return path


def test_a_result_is_collected_with_its_headline(bench: Any, tmp_path: Path) -> None:
    ok = script(tmp_path, "ok", """
        from _common import write_result, print_table
        rows = [{"case": "x", "ours": 2.0, "peer": 1.0}]
        print_table(rows)
        write_result("okbench", rows, headline={"ratio": 2.0})
    """)
    run = bench.run_one(ok, timeout=60)
    assert run["status"] == "ok"
    assert list(run["results"]) == ["okbench"]
    doc = run["results"]["okbench"]
    assert doc["rows"] == [{"case": "x", "ours": 2.0, "peer": 1.0}]
    assert doc["machine"]["cores"] >= 1
    row = bench.summarise([run])[0]
    assert row["status"] == "ok" and "ratio=2" in row["headline"]

    # a second benchmark that writes nothing does not inherit the first one's result
    quiet = script(tmp_path, "quiet", "print('just text')\n")
    run2 = bench.run_one(quiet, timeout=60)
    assert run2["results"] == {} and run2["last_line"] == "just text"
    assert "(no JSON) just text" in bench.summarise([run2])[0]["headline"]


def test_failure_and_timeout_are_reported_and_the_timed_out_bench_is_killed(
    bench: Any, tmp_path: Path
) -> None:
    bad = script(tmp_path, "bad", "raise SystemExit(3)\n")
    assert bench.run_one(bad, timeout=60)["status"] == "failed (exit 3)"

    pidfile = tmp_path / "child.pid"
    slow = script(tmp_path, "slow", f"""
        import subprocess, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        open({str(pidfile)!r}, "w").write(str(child.pid))
        print("started", flush=True)
        time.sleep(120)
    """)
    run = bench.run_one(slow, timeout=3)
    assert run["status"].startswith("timeout")
    pid = int(pidfile.read_text())
    # the bench's own child (same session) was killed too; reap check via /proc
    stat = Path(f"/proc/{pid}/stat")

    def gone() -> bool:
        try:
            return stat.read_text().split(")")[1].split()[0] == "Z"
        except FileNotFoundError:
            return True

    deadline = time.monotonic() + 10
    while not gone() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone()


def test_main_writes_a_summary_and_fails_when_a_bench_fails(
    bench: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench, "HERE", tmp_path)
    script(tmp_path, "one", "from _common import write_result\nwrite_result('one', [{'a': 1}])\n")
    script(tmp_path, "two", "raise SystemExit(1)\n")
    assert bench.main(["--list"]) == 0
    assert bench.main(["-k", "one"]) == 0
    summary = json.loads((bench.RESULTS_DIR / "summary.json").read_text())
    assert [r["benchmark"] for r in summary["runs"]] == ["bench_one.py"]
    assert bench.main([]) == 1


def test_common_helpers(bench: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import _common as c

    calls = []
    c.compare(lambda: calls.append("o") or 4.0, lambda: calls.append("p") or 2.0, rounds=2)
    assert calls == ["o", "p", "o", "p"]  # alternating rounds
    cmp = c.compare(iter([1.0, 3.0, 2.0]).__next__, iter([1.0, 1.0, 1.0]).__next__, rounds=3)
    assert (cmp.ours, cmp.peer, cmp.ratio) == (2.0, 1.0, 2.0)
    assert c.ratio(1.0, 0.0) == math.inf and math.isnan(c.ratio(0.0, 0.0))
    assert c.measure(lambda: None, 10) > 0
    with pytest.raises(ValueError):
        c.measure(lambda: None, 0)
    monkeypatch.setenv("AMQ_BENCH_QUICK", "1")
    assert c.quick() and c.scale(100) == 10 and c.scale(100, 3) == 3
    monkeypatch.delenv("AMQ_BENCH_QUICK")
    assert c.scale(100) == 100
    with pytest.raises(ValueError, match="name"):
        c.write_result("../escape", [])
    path = c.write_result("nan", [{"x": math.nan}])
    assert json.loads(path.read_text())["rows"] == [{"x": "nan"}]


@pytest.mark.parametrize(("keep", "raises"), [("0", False), ("0", True), ("1", False)])
def test_a_work_dir_goes_when_the_benchmark_exits_unless_amq_keep_logs(
    tmp_path: Path, keep: str, raises: bool
) -> None:
    import os
    import shutil
    import subprocess

    where = tmp_path / "where"
    body = script(tmp_path, "work", f"""
        from _common import work_dir
        work = work_dir("bench-test-work-")
        (work / "broker.log").write_text("a log")
        open({str(where)!r}, "w").write(str(work))
        if {raises!r}:
            raise RuntimeError("the benchmark failed")
    """)
    env = {**os.environ, "AMQ_KEEP_LOGS": keep}
    done = subprocess.run([sys.executable, str(body)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == (1 if raises else 0), done.stderr
    work = Path(where.read_text())
    try:
        assert work.name.startswith("bench-test-work-")
        assert work.exists() == (keep == "1"), done.stderr
        if keep == "1":
            assert f"kept {work}" in done.stderr
    finally:
        shutil.rmtree(work, ignore_errors=True)
