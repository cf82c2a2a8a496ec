"""``amq chaos``: the Toxiproxy-compatible proxy server (and, later, the scenarios).

Each subcommand is one decorated function on the ``chaos`` group below; add a new
one (e.g. ``run``) as another ``@chaos.command()`` function.
"""

from __future__ import annotations

import logging

import click


@click.group()
def chaos() -> None:
    """Toxiproxy-compatible proxy and chaos scenarios."""


@chaos.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address of the HTTP API.")
@click.option(
    "--port",
    default=8474,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Port of the HTTP API (0 picks a free one).",
)
@click.option("-v", "--verbose", is_flag=True, help="Also log every connection.")
def proxy(host: str, port: int, verbose: bool) -> None:
    """Run a Toxiproxy 2.x-compatible server in the foreground (Ctrl-C stops it).

    Drive it with any Toxiproxy client, e.g. the PyPI `toxiproxy-python`:
    Toxiproxy().update_api_consumer("127.0.0.1", 8474).
    """
    from chaos.proxy.server import serve_forever

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )

    def ready(url: str) -> None:
        click.echo(f"toxiproxy-compatible API on {url}", err=False)

    try:
        serve_forever(host, port, on_ready=ready)
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc}") from exc


@chaos.command(context_settings={"max_content_width": 100})
@click.argument("names", nargs=-1)
@click.option("--rounds", default=1, show_default=True, type=click.IntRange(1), help="Rounds per scenario and mode.")
@click.option("--report", "report_dir", type=click.Path(file_okay=False), default=None,
              help="Directory for report.json (and timeline.png for the scenarios).")
@click.option("--mode", default="both", show_default=True,
              type=click.Choice(["replicated", "shared-store", "both", "single"]),
              help="HA mode of the embedded pair (single: one broker killed and restarted in place; "
                   "not for the nemesis).")
@click.option("--rate", default=None, type=click.FloatRange(0),
              help="Messages/s offered by the producer [scenarios: 200; nemesis: 20 per producer].")
@click.option("--seed", default=None, type=click.IntRange(0),
              help="Nemesis: the first round's seed (a failing round prints its own); default: random.")
@click.option("--faults", "faults", default="default", show_default=True,
              help="Nemesis: fault kinds, comma-separated, or 'all' (adds the pending ones) or 'default'.")
@click.option("--double-faults", is_flag=True,
              help="Nemesis: let two pair faults overlap (beyond the single-failure promise).")
@click.option("--no-disk", is_flag=True, help="Nemesis: no tmpfs data directories (no disk-full fault).")
@click.option("--link-timeout", default=1.0, show_default=True, type=click.FloatRange(0.05, 600),
              help="Nemesis: the pair's replication --link-timeout (s); a frozen master is taken over "
                   "after about 4x this (with --witness, once its lease ran out: up to 1.5x this).")
@click.option("--dedupe-window", default=100_000, show_default=True, type=click.IntRange(0),
              help="Nemesis: the pair's dedupe_window_size (keys); a small one (e.g. 3000, about 20 s of the "
                   "workload) lets trackMessages replays outlive it.")
@click.option("--witness", "witness", is_flag=True,
              help="Nemesis: run an amq broker witness (in a network namespace of its own) and give both nodes "
                   "--witness; replicated, adds the partition kinds (and partition-witness) to the default set; "
                   "a shared store is then elected by the witness's lease, not its lock file.")
@click.option("--keep", is_flag=True, help="Nemesis: keep the scratch directory (broker logs, nemesis.log) "
                                         "even when the run passes.")
@click.option("--list", "list_only", is_flag=True, help="List the scenarios and the nemesis's fault kinds, and exit.")
def run(names: tuple[str, ...], rounds: int, report_dir: str | None, mode: str, rate: float | None,
        seed: int | None, faults: str, double_faults: bool, no_disk: bool, link_timeout: float,
        dedupe_window: int, witness: bool, keep: bool, list_only: bool) -> None:
    """Run chaos scenarios (e.g. kill-master) or the nemesis, and check their invariants.

    \b
    Scenarios: one line per round, then a table; exit status 1 when an invariant failed.
      amq chaos run kill-master --rounds 20 --mode both --report out/

    \b
    The nemesis: randomized rounds of faults (SIGKILL/SIGSTOP of the master, SIGKILL of
    the slave, restarts, replication and client link cuts, half-open links, latency, a
    full disk, the shared lock file deleted, kernel partitions between network
    namespaces, power loss on a FUSE layer, a flipped journal bit; sometimes two at
    once) under a mixed
    workload (receipted, transactional and fire-and-forget producers, consumers in
    every ack mode, durable topic subscribers, a bridge). A checker then reads the
    recorded history: no receipted message lost, none delivered twice, no acked
    message back, never two masters, the pair whole after every round. Each round
    prints its seed; --seed replays the schedule.
      amq chaos run nemesis --rounds 3 --mode both
      amq chaos run nemesis --rounds 200 --mode both --report out/
      amq chaos run nemesis --mode replicated --seed 123 --rounds 1 --faults all
      amq chaos run nemesis --mode replicated --rounds 20 --witness --faults all
    Exit status: 0 no violation, 1 violations, 2 bad arguments or no cluster, 130 Ctrl-C.
    """
    from pathlib import Path

    if list_only:
        from chaos.nemesis.cli import describe_kinds
        from chaos.scenarios.cli import list_scenarios

        click.echo(list_scenarios())
        click.echo("\nnemesis fault kinds (amq chaos run nemesis --faults ...):\n" + describe_kinds())
        return
    report = Path(report_dir) if report_dir else None
    if "nemesis" in names:
        if len(names) > 1:
            raise click.UsageError("run the nemesis on its own: amq chaos run nemesis [options]")
        from chaos.nemesis.cli import random_seed, run_nemesis
        from chaos.nemesis.runner import NemesisParams
        from chaos.nemesis.schedule import parse_kinds

        try:
            kinds = parse_kinds(faults)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--faults") from exc
        params = NemesisParams(rounds=rounds, seed=random_seed() if seed is None else seed,
                               kinds=tuple(kinds) if kinds is not None else None, double_faults=double_faults,
                               rate=20.0 if rate is None else rate, disk=not no_disk, link_timeout_s=link_timeout,
                               dedupe_window_keys=dedupe_window, witness=witness)
        raise SystemExit(run_nemesis(mode, params, report_dir=report, echo=click.echo, seed_given=seed is not None,
                                     keep=keep))
    if seed is not None or faults != "default" or double_faults or no_disk or keep or witness:
        raise click.UsageError("--seed, --faults, --double-faults, --no-disk, --witness and --keep are options of "
                               "the nemesis (amq chaos run nemesis)")
    from chaos.scenarios.cli import run_cli
    from chaos.scenarios.runner import RunParams

    code = run_cli(names, rounds=rounds, report_dir=report, mode=mode,
                   params=RunParams(rate=200.0 if rate is None else rate), echo=click.echo)
    raise SystemExit(code)
