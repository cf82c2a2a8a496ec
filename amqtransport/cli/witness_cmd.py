"""``amq broker witness``: the arbiter of replicated pairs (:mod:`amqtransport.broker.ha.witness`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

__all__ = ["witness"]


@click.command("witness")
@click.option("--port", type=int, required=True, help="TCP port the pairs' nodes reach the witness on.")
@click.option("--data-dir", type=click.Path(file_okay=False), required=True,
              help="Directory of the witness's durable state (witness-state.json; keep it: a witness that "
                   "lost it may grant what it granted before).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Bind address (0.0.0.0: every interface).")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
def witness(port: int, data_dir: str, host: str, log_level: str) -> None:
    """Run a witness for replicated pairs in the foreground until SIGTERM or Ctrl-C.

    Give both nodes of a pair `--witness HOST:PORT` (one witness serves any number of
    pairs, each known by its cluster secret): a master that loses its slave then goes on
    receipting while the witness renews its lease, and the slave takes over only with the
    witness's grant, once that lease ran out. Prints `witness listening on tcp://HOST:PORT`
    once it accepts requests. Exit codes: 0 stopped, 1 cannot start, 2 bad options.
    """
    from amqtransport.broker.ha.witness import run_witness
    from amqtransport.cli.broker_cmd import setup_logging
    from amqtransport.processes.spawn import private_dir

    if not 0 < port < 65536:
        click.echo(f"error: --port must be a port number (1-65535), got {port}", err=True)
        sys.exit(2)
    setup_logging(log_level)
    os.umask(0o077)
    try:
        private_dir(data_dir)
    except OSError as exc:
        click.echo(f"error: cannot create the data directory {data_dir}: {exc.strerror or exc}", err=True)
        sys.exit(1)
    try:
        code = run_witness(host, port, Path(data_dir).resolve())
    except ValueError as exc:  # an unreadable state file
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    except OSError as exc:
        click.echo(f"error: cannot listen on {host}:{port}: {exc.strerror or exc}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        code = 0
    sys.exit(code)
