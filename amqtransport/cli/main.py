"""Entry point of the ``amq`` command.

Subcommand groups are imported lazily so that ``amq uri explain`` does not pay for
importing the broker, Spark or the chaos proxy. Each entry maps a command name to
``module:attribute`` of a click command or group.

The CLI is the application layer: it is the only part of ``amqtransport`` allowed to
import ``bridge`` and ``chaos`` (the layering test knows this).
"""

from __future__ import annotations

import importlib
from typing import Any

import click

SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    # name: (module, attribute, short help)
    "uri": ("amqtransport.cli.uri_cmd", "uri", "Parse and explain connection URIs."),
    "broker": ("amqtransport.cli.broker_cmd", "broker", "Run the embedded broker (one node or an HA pair)."),
    "send": ("amqtransport.cli.client_cmd", "send", "Send N messages through a URI, with receipts."),
    "recv": ("amqtransport.cli.client_cmd", "recv", "Receive N messages through a URI."),
    "browse": ("amqtransport.cli.client_cmd", "browse", "Show what a queue holds, consuming nothing."),
    "bridge": ("amqtransport.cli.bridge_cmd", "bridge", "Run or inspect the network-bridge agent."),
    "chaos": ("amqtransport.cli.chaos_cmd", "chaos", "Toxiproxy-compatible proxy and chaos scenarios."),
    "demo": ("amqtransport.cli.demo_cmd", "demo", "Spark producer surviving a master kill (the main job)."),
    "spark": ("amqtransport.cli.spark_cmd", "spark", "Spark cluster helpers: pack-env for --archives."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name in SUBCOMMANDS if self._load(name) is not None)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return self._load(cmd_name)

    def _load(self, name: str) -> click.Command | None:
        spec = SUBCOMMANDS.get(name)
        if spec is None:
            return None
        module_name, attr, _ = spec
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                return None  # that part of the tool is not built yet
            raise
        command: Any = getattr(module, attr)
        return command  # type: ignore[no-any-return]


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="amqtransport")
def cli() -> None:
    """amqtransport: failover messaging over STOMP 1.2.

    Connection URIs follow ActiveMQ: failover:(tcp://a:61613,tcp://b:61613)?randomize=false,
    static:failover:(...), masterslave:(a,b). Try `amq uri explain --json URI`.
    """


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
