"""``amq bridge``: run the network-bridge agent, or print the status of a running one."""

from __future__ import annotations

import json
import logging
import sys
import urllib.error
import urllib.request

import click

from amqtransport.errors import ConfigError

DEFAULT_URL = "http://127.0.0.1:8162"


@click.group("bridge")
def bridge() -> None:
    """Network bridges between brokers (ActiveMQ networkConnector semantics)."""


@bridge.command("run")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
def run(config: str, log_level: str) -> None:
    """Run the bridges of CONFIG (TOML) in the foreground until Ctrl-C or SIGTERM.

    Logs a line whenever a bridge goes up, down or is rebuilt, with the remote address
    actually connected; serves /status and /metrics on status_listen.
    """
    from bridge.agent import BridgeAgent
    from bridge.config import load_config

    logging.basicConfig(level=getattr(logging, log_level.upper()), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_config(config)
    except ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    agent = BridgeAgent(cfg)
    try:
        agent.run_forever()
    except OSError as exc:  # e.g. the status port is taken
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)


@bridge.command("status")
@click.option("--url", default=None, help=f"Status endpoint of the agent [default: {DEFAULT_URL}, or "
              "status_listen of --config].")
@click.option("--config", "config_path", default=None, type=click.Path(dir_okay=False),
              help="Take the URL from this bridge config's status_listen.")
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
@click.option("--timeout", default=5.0, show_default=True, help="Seconds to wait for the agent.")
def status(url: str | None, config_path: str | None, as_json: bool, timeout: float) -> None:
    """Print the state of every bridge of a running agent (a table, or --json)."""
    from bridge.status import render_table

    if url is None and config_path is not None:
        from bridge.config import load_config

        try:
            cfg = load_config(config_path)
        except ConfigError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        addr = cfg.status_address
        if addr is None:
            click.echo("error: that config has no status_listen", err=True)
            sys.exit(2)
        url = f"http://{addr[0]}:{addr[1]}"
    base = (url or DEFAULT_URL).rstrip("/")
    if not base.startswith(("http://", "https://")):
        base = "http://" + base
    target = base if base.endswith("/status") else base + "/status"
    try:
        with urllib.request.urlopen(target, timeout=timeout) as resp:  # noqa: S310 - user-given URL
            data = json.loads(resp.read().decode("utf-8"))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        click.echo(f"error: cannot read {target}: {getattr(exc, 'reason', exc)}", err=True)
        sys.exit(1)
    if as_json:
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(render_table(data))
