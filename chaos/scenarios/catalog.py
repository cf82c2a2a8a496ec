"""The scenario registry: what each fault does, how long it lasts, what bounds apply.

A :class:`Scenario` is data plus two small functions: ``inject(stage)`` starts the
fault (returns a one-line description for the round's report) and ``heal(stage)``
ends it after ``hold_s`` seconds (``None`` for a kill, which heals by failover; the
killed node is restarted between rounds by ``Cluster.recover``). Faults act on the
proxy or process of the node that is master when the fault starts.

Add a scenario with :func:`register`; ``amq chaos run --list`` shows the registry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from chaos.harness.cluster import EMBEDDED_MODES, Stage

__all__ = ["Scenario", "SCENARIOS", "register", "get_scenario"]


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    inject: Callable[[Stage], str]
    heal: Callable[[Stage], None] | None = None
    hold_s: float = 0.0
    recovery_bound_s: float = 15.0
    heartbeat_ms: int = 1000
    connect_timeout_s: float = 2.0
    kinds: tuple[str, ...] = EMBEDDED_MODES
    kills: bool = False  # the cluster needs ``recover()`` after the round
    detection_bound_s: float | None = None  # half-open, slow-close: heart-beats must notice within this
    # "broker": the cluster behind the proxies is what the clients use; "bridge": the
    # producer sends to a spoke broker bridged to the pair behind the proxies
    topology: str = "broker"
    # "receipt": recovery = fault -> receipt of the first send after it; "delivery":
    # fault -> arrival at the consumer of the first message sent after it (a bridge:
    # the producer's own broker is not hit by the fault)
    recovery_by: str = "receipt"
    # Copies of a message that reach the consumer's duplicate filter because the
    # broker does not drop a replayed send (ActiveMQ): reported, not a failure.
    broker_dedupes: bool = True


SCENARIOS: dict[str, Scenario] = {}


def register(scenario: Scenario) -> Scenario:
    if scenario.name in SCENARIOS:
        raise ValueError(f"scenario {scenario.name!r} is already registered")
    SCENARIOS[scenario.name] = scenario
    return scenario


def get_scenario(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise KeyError(
            f"unknown scenario {name!r}; known: {', '.join(sorted(SCENARIOS))}"
        ) from None


# -- faults ---------------------------------------------------------------------------------

def _kill_master(stage: Stage) -> str:
    return stage.cluster.kill_master(stage.mark_fault)


def _disable_master(stage: Stage) -> str:
    proxy = stage.master_proxy()
    stage.active["disabled"] = proxy
    stage.disable(proxy)
    stage.mark_fault()
    return f"disabled proxy {proxy.name} (master alive behind it)"


def _enable_disabled(stage: Stage) -> None:
    proxy = stage.active.pop("disabled", None)
    if proxy is not None:
        stage.enable(proxy)


def _toxics_on_master(specs: list[tuple[str, str, dict[str, int]]]) -> Callable[[Stage], str]:
    def inject(stage: Stage) -> str:
        proxy = stage.master_proxy()
        stage.active["toxics"] = proxy
        names = [stage.add_toxic(proxy, kind, stream, attrs) for kind, stream, attrs in specs]
        stage.mark_fault()
        detail = ", ".join(
            f"{kind}/{stream} {attrs}" for kind, stream, attrs in specs
        )
        return f"{proxy.name}: {detail} ({len(names)} toxics)"

    return inject


def _remove_toxics(stage: Stage) -> None:
    proxy = stage.active.pop("toxics", None)
    if proxy is not None:
        stage.remove_toxics(proxy)


def _slow_close_then_kill(delay_ms: int) -> Callable[[Stage], str]:
    add = _toxics_on_master([("slow_close", "downstream", {"delay": delay_ms})])

    def inject(stage: Stage) -> str:
        added = add(stage)
        return f"{added}; then {stage.cluster.kill_master(stage.mark_fault)}"

    return inject


# -- the catalogue --------------------------------------------------------------------------

register(Scenario(
    name="kill-master",
    summary="SIGKILL the master broker's process; the slave takes over (single: restart in place)",
    inject=_kill_master,
    kills=True,
    recovery_bound_s=15.0,
))

register(Scenario(
    name="kill-master-activemq",
    summary="kill-master against a real ActiveMQ 5.17 shared-store pair "
            "(ActiveMQ keeps replayed sends: the consumer's dedupe drops them, counted as deduped)",
    inject=_kill_master,
    kills=True,
    kinds=("activemq",),
    recovery_bound_s=30.0,
    broker_dedupes=False,
))

register(Scenario(
    name="partition-master",
    summary="disable the master's proxy for 2 s while the master lives (clients cut off), then enable",
    inject=_disable_master,
    heal=_enable_disabled,
    hold_s=2.0,
    recovery_bound_s=8.0,
))

register(Scenario(
    name="latency-spike",
    summary="400 ms +/- 100 ms latency both ways on the master's proxy for 3 s",
    inject=_toxics_on_master([
        ("latency", "downstream", {"latency": 400, "jitter": 100}),
        ("latency", "upstream", {"latency": 400, "jitter": 100}),
    ]),
    heal=_remove_toxics,
    hold_s=3.0,
    recovery_bound_s=5.0,
))

HALF_OPEN_HEARTBEAT_MS = 500

register(Scenario(
    name="half-open",
    summary="timeout toxic 0 both ways on the master's proxy for 3 s: bytes vanish, nothing closes; "
            f"client heart-beats ({HALF_OPEN_HEARTBEAT_MS} ms) must notice within about two intervals",
    inject=_toxics_on_master([
        ("timeout", "downstream", {"timeout": 0}),
        ("timeout", "upstream", {"timeout": 0}),
    ]),
    heal=_remove_toxics,
    hold_s=3.0,
    heartbeat_ms=HALF_OPEN_HEARTBEAT_MS,
    connect_timeout_s=1.0,
    recovery_bound_s=10.0,
    detection_bound_s=2 * HALF_OPEN_HEARTBEAT_MS / 1000 + 0.5,
))

register(Scenario(
    name="reset-peer",
    summary="reset_peer toxic on the master's proxy for 1 s: the next bytes each way are answered "
            "with a TCP reset (new connections too), then removed",
    inject=_toxics_on_master([("reset_peer", "upstream", {"timeout": 0})]),
    heal=_remove_toxics,
    hold_s=1.0,
    recovery_bound_s=8.0,
))

SLOW_CLOSE_MS = 4000

register(Scenario(
    name="slow-close",
    summary=f"slow_close {SLOW_CLOSE_MS / 1000:g} s on the master's proxy, then SIGKILL the master: "
            "the close reaches the clients late, so their heart-beats (1 s) must find the dead "
            "link first, within about two intervals",
    inject=_slow_close_then_kill(SLOW_CLOSE_MS),
    heal=_remove_toxics,
    hold_s=SLOW_CLOSE_MS / 1000 + 1.0,  # keep the toxic until the delayed close has happened
    kills=True,
    recovery_bound_s=15.0,
    detection_bound_s=2 * 1.0 + 0.5,
))

register(Scenario(
    name="bandwidth-starve",
    summary="bandwidth 2 KB/s both ways on the master's proxy for 3 s (throughput collapses, "
            "nothing may be lost or reconnect-stormed), then removed",
    inject=_toxics_on_master([
        ("bandwidth", "downstream", {"rate": 2}),
        ("bandwidth", "upstream", {"rate": 2}),
    ]),
    heal=_remove_toxics,
    hold_s=3.0,
    recovery_bound_s=6.0,
))

register(Scenario(
    name="bridge-remote-master-kill",
    summary="producer on a spoke broker, bridged (network connector, masterslave: over the proxies) "
            "to a hub pair where the consumer reads; SIGKILL the hub master: the bridge is torn down "
            "and rebuilt on the new master (recovery measured by delivery at the hub)",
    inject=_kill_master,
    kills=True,
    kinds=("replicated", "shared-store"),
    topology="bridge",
    recovery_by="delivery",
    recovery_bound_s=15.0,
))
