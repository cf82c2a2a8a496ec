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
    from chaos.server import serve_forever

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


@chaos.command()
@click.argument("names", nargs=-1)
@click.option("--rounds", default=1, show_default=True, type=click.IntRange(1), help="Rounds per scenario and mode.")
@click.option("--report", "report_dir", type=click.Path(file_okay=False), default=None,
              help="Directory for report.json and timeline.png.")
@click.option("--mode", default="both", show_default=True,
              type=click.Choice(["replicated", "shared-store", "both", "single"]),
              help="HA mode of the embedded pair (single: one broker killed and restarted in place).")
@click.option("--rate", default=200.0, show_default=True, type=click.FloatRange(0),
              help="Messages/s offered by the producer (0: as fast as receipts allow).")
@click.option("--list", "list_only", is_flag=True, help="List the scenarios and exit.")
def run(names: tuple[str, ...], rounds: int, report_dir: str | None, mode: str, rate: float,
        list_only: bool) -> None:
    """Run chaos scenarios (e.g. kill-master) and check their invariants.

    One line per round, then a table; exit status 1 when an invariant failed.
    """
    from pathlib import Path

    from chaos.scenarios.cli import list_scenarios, run_cli
    from chaos.scenarios.runner import RunParams

    if list_only:
        click.echo(list_scenarios())
        return
    code = run_cli(names, rounds=rounds, report_dir=Path(report_dir) if report_dir else None,
                   mode=mode, params=RunParams(rate=rate), echo=click.echo)
    raise SystemExit(code)
