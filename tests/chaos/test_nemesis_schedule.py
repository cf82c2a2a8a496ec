"""The nemesis's schedule generator: pure, seeded, replayable, and within its rules.

No broker here: plans are data.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.nemesis.schedule import (
    FAULT_KINDS,
    LEAVES,
    RoundPlan,
    default_kinds,
    next_seed,
    parse_kinds,
    plan_round,
    plan_rounds,
    round_seeds,
)

pytestmark = pytest.mark.chaos

ALL = list(FAULT_KINDS)
MODES = ("replicated", "shared-store")


def test_same_seed_same_plan_and_different_seeds_differ() -> None:
    a = plan_rounds(42, 30, "replicated", ALL)
    b = plan_rounds(42, 30, "replicated", ALL)
    assert a == b
    c = plan_rounds(43, 30, "replicated", ALL)
    assert [p.steps for p in a] != [p.steps for p in c]


def test_a_failing_rounds_seed_replays_that_round_as_round_one() -> None:
    plans = plan_rounds(7, 12, "shared-store", ALL)
    ninth = plans[8]
    replay = plan_rounds(ninth.seed, 4, "shared-store", ALL)
    assert replay[0].steps == ninth.steps and replay[0].window_s == ninth.window_s
    assert [p.steps for p in replay] == [p.steps for p in plans[8:12]]


def test_seed_chain() -> None:
    seeds = round_seeds(1, 5)
    assert seeds[0] == 1 and len(set(seeds)) == 5
    assert all(next_seed(a) == b for a, b in zip(seeds, seeds[1:], strict=False))
    assert 0 <= next_seed(2**60) < 2**48


def test_the_mode_changes_the_stream_and_filters_the_kinds() -> None:
    for seed in range(300):
        rep = plan_round(seed, "replicated", ALL)
        shared = plan_round(seed, "shared-store", ALL)
        assert all(s.kind != "delete-lock" for s in rep.steps)
        assert all(s.kind != "cut-replication" for s in shared.steps)
        assert all(s.params.get("where", "client") == "client" for s in shared.steps)


def _check_rules(plan: RoundPlan, enabled: list[str], double: bool = False) -> None:
    dead = 0
    pair_until = 0.0
    assert plan.steps, "every round has at least one fault"
    assert list(plan.steps) == sorted(plan.steps, key=lambda s: s.at)
    for step in plan.steps:
        fk = FAULT_KINDS[step.kind]
        assert step.kind in enabled and plan.mode in fk.modes
        if fk.hold is None:
            assert step.hold == 0
        else:
            assert fk.hold[0] <= step.hold <= fk.hold[1]
        if step.kind == "freeze-master":
            assert 0.5 <= step.hold <= 5.0
        if step.kind == "latency":
            assert 100 <= int(step.params["ms"]) <= 800
        if fk.scope == "pair":
            if step.kind == "restart-dead":
                assert dead == 1, plan.describe()
                dead = 0
            else:
                if not double or step.kind in LEAVES:
                    assert dead == 0, f"a second pair failure while a node is down: {plan.describe()}"
                if not double:
                    assert step.at >= pair_until, f"overlapping pair faults: {plan.describe()}"
                if step.kind in LEAVES:
                    dead = 1
            pair_until = max(pair_until, step.until)
        assert step.until <= plan.window_s - 1.0 + 1e-9
    assert plan.window_s >= 4.0


@pytest.mark.parametrize("mode", MODES)
def test_plans_keep_the_single_failure_rules(mode: str) -> None:
    concurrent = 0
    kinds_seen: set[str] = set()
    for seed in range(2000):
        plan = plan_round(seed, mode, ALL)
        _check_rules(plan, ALL)
        kinds_seen.update(s.kind for s in plan.steps)
        ats = [s.at for s in plan.steps]
        concurrent += any(b - a <= 0.5 for a, b in zip(ats, ats[1:], strict=False))
    assert kinds_seen == {k for k, fk in FAULT_KINDS.items() if mode in fk.modes}
    assert 100 < concurrent < 1900  # "sometimes two at once"


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**48), mode=st.sampled_from(MODES),
       kinds=st.lists(st.sampled_from(ALL), min_size=1, unique=True), double=st.booleans())
def test_any_seed_and_kind_set_gives_a_valid_plan(seed: int, mode: str, kinds: list[str], double: bool) -> None:
    plan = plan_round(seed, mode, kinds, double_faults=double)
    applicable = [k for k in kinds if mode in FAULT_KINDS[k].modes]
    if not applicable or applicable == ["restart-dead"]:
        assert plan.steps == ()
        return
    _check_rules(plan, kinds, double)


def test_double_faults_allows_overlapping_pair_faults() -> None:
    kinds = ["freeze-master", "cut-replication", "disk-full"]
    overlapping = 0
    for seed in range(500):
        plan = plan_round(seed, "replicated", kinds, double_faults=True)
        pair = [s for s in plan.steps if FAULT_KINDS[s.kind].scope == "pair"]
        overlapping += any(b.at < a.until for a, b in zip(pair, pair[1:], strict=False))
    assert overlapping > 0


def test_default_kinds_leave_out_pending_ones() -> None:
    for mode in MODES:
        names = default_kinds(mode)
        assert all(not FAULT_KINDS[n].pending for n in names)
        assert all(mode in FAULT_KINDS[n].modes for n in names)
    assert "kill-master" in default_kinds("replicated")
    # the frozen master (issue 11 item 1) and the deleted lock file (item 3) are fixed:
    # both are in the default set, delete-lock only where there is a lock file
    assert "freeze-master" in default_kinds("replicated") and "freeze-master" in default_kinds("shared-store")
    assert "delete-lock" in default_kinds("shared-store") and "delete-lock" not in default_kinds("replicated")


def test_the_witness_adds_the_partition_kinds_to_the_replicated_default_set() -> None:
    split = {"partition-replication", "partition-one-way", "isolate-node"}
    without = set(default_kinds("replicated"))
    with_witness = set(default_kinds("replicated", witness=True))
    assert not split & without and "partition-witness" not in without
    assert with_witness == without | split | {"partition-witness"}
    # a shared store's partitions stay pending with a witness too: its default set does not change
    assert default_kinds("shared-store", witness=True) == default_kinds("shared-store")
    assert "partition-witness" not in default_kinds("shared-store", witness=True)
    assert FAULT_KINDS["partition-witness"].modes == ("replicated",)
    plan = plan_round(40, "replicated", ["partition-witness"])
    assert plan.steps and all(s.kind == "partition-witness" and s.params["node"] in ("master", "slave")
                              for s in plan.steps)


def test_parse_kinds() -> None:
    assert parse_kinds("default") is None and parse_kinds("") is None
    assert parse_kinds("all") == ALL
    assert parse_kinds(" kill-master, latency ") == ["kill-master", "latency"]
    with pytest.raises(ValueError, match="unknown fault kind.*kill-everything"):
        parse_kinds("kill-master,kill-everything")
    with pytest.raises(ValueError, match="names no fault"):
        parse_kinds(",")


def test_bad_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="mode must be one of"):
        plan_round(1, "single")


def test_plan_json_round_trip() -> None:
    for plan in plan_rounds(99, 20, "replicated", ALL):
        again = RoundPlan.from_json(json.loads(json.dumps(plan.to_json())))
        assert again == plan
        assert plan.describe()


def test_the_generator_is_pure() -> None:
    """No clock, no I/O, no global RNG: only hashlib and random.Random(seed)."""
    src = Path(__file__).resolve().parents[2] / "chaos" / "nemesis" / "schedule.py"
    tree = ast.parse(src.read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"__future__", "hashlib", "random", "collections", "dataclasses", "typing"}
    calls = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert not {c for c in calls if c.startswith("random.") and c != "random.Random"}
