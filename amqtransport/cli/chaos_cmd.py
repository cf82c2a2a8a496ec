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
