"""``amq broker``: run the embedded broker (``run``); helpers (``hash-password``, ``status``).

The HA commands (``pair``, ``status``) are added to the same :data:`broker` group by
``amqtransport.broker.ha`` (see :func:`register`); keep subcommands independent.
"""

from __future__ import annotations

import asyncio
import gc
import getpass
import logging
import os
import sys
from pathlib import Path

import click

from amqtransport.cli.ha_cmd import ha_options, run_ha
from amqtransport.errors import ConfigError
from amqtransport.processes.spawn import private_dir

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@click.group("broker")
def broker() -> None:
    """The embedded STOMP broker: 'run' one (with --ha, one node of a master/slave
    pair), start a 'pair', ask a running broker or HA node for its 'status' (role,
    message counts, memory), 'release' an HA master that holds receipts for a peer that
    is gone for good, run a 'witness' for pairs, 'hash-password' for a users file."""


def register(command: click.Command) -> None:
    """Add a subcommand to ``amq broker`` (used by optional parts such as HA)."""
    broker.add_command(command)


def build_config(
    *,
    config_file: str | None,
    overrides: dict[str, object],
) -> object:
    """Config file (if any) + command-line overrides, validated; ConfigError on bad input."""
    from amqtransport.broker.config import BrokerConfig, config_from_mapping, load_config

    base = load_config(config_file) if config_file else BrokerConfig()
    data = base.model_dump()
    data.update({k: v for k, v in overrides.items() if v is not None})
    return config_from_mapping(data, "command line")


class ByteSize(click.ParamType[int]):
    """A number of bytes: ``1048576``, ``512k``, ``64m``, ``2g`` (binary units, any case)."""

    name = "bytes"
    _UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip().lower().removesuffix("b").removesuffix("i")
        number, unit = (text[:-1], text[-1]) if text and text[-1] in self._UNITS else (text, "")
        try:
            n = int(number)
        except ValueError:
            self.fail(f"{value!r} is not a size in bytes (e.g. 1048576, 512m, 2g)", param, ctx)
        if n < 0:
            self.fail(f"{value!r} is negative", param, ctx)
        return n * self._UNITS[unit]


def setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), stream=sys.stderr, format=LOG_FORMAT)


#: the garbage collector's young-generation threshold in a broker process (Python's is 700)
GC_YOUNG_THRESHOLD = 50_000


def tune_gc() -> None:
    """Collect the young generation every :data:`GC_YOUNG_THRESHOLD` allocations, not
    700, and leave what exists at startup (modules, configuration) out of every
    collection. A broker allocates a few objects per message and keeps many of them
    (resident messages, their headers): with the default, collections over the young
    and middle generations took a quarter of the broker's CPU in a selective drain of
    a deep queue (BENCHMARKS.md, selective consumer). Cyclic garbage waits longer, at
    most that many allocations."""
    gc.freeze()
    young, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)
    logging.getLogger("amqtransport.broker").info(
        "garbage collector: young generation every %d allocations (was %d), %d startup objects frozen",
        GC_YOUNG_THRESHOLD, young, gc.get_freeze_count())


#: open files a broker needs besides its clients' sockets (journal segments and their
#: readers, the checkpoint, the HA and HTTP ports' connections, logs)
FILES_BESIDES_CLIENTS = 256


def fit_open_files(max_connections: int) -> None:
    """Raise this process's soft open-file limit so ``max_connections`` clients fit (as
    far as the hard limit allows; a warning says when it does not). A process is given
    1024 on most systems, which would refuse clients in accept() long before the cap."""
    try:
        import resource
    except ImportError:  # not on POSIX: nothing to fit
        return
    log = logging.getLogger("amqtransport.broker")
    wanted = max_connections + FILES_BESIDES_CLIENTS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        new = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit from %d: %s", soft, exc)
            new = soft
        else:
            log.info("open-file limit raised from %d to %d for max_connections=%d", soft, new, max_connections)
        soft = new
    if soft != resource.RLIM_INFINITY and soft < wanted:
        log.warning(
            "open-file limit is %d: about %d clients can connect, fewer than max_connections=%d "
            "(raise the hard limit: ulimit -Hn, systemd LimitNOFILE=)",
            soft, max(0, soft - FILES_BESIDES_CLIENTS), max_connections,
        )


@broker.command("run")
@click.option("--port", type=int, default=None, help="STOMP port [default: 61613; 0 = any free port].")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Journal directory [default: data_dir of --config, else ./amq-data].")
@click.option("--host", default=None, help="Bind address [default: 127.0.0.1].")
@click.option("--name", default=None, help="Broker name (message ids, logs) [default: embedded].")
@click.option("--users", "users_file", type=click.Path(dir_okay=False), default=None,
              help="File of user:password lines; makes authentication mandatory.")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
              help="TOML config file (keys of BrokerConfig, top level or under [broker]).")
@click.option("--log-level", default=None, type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
@click.option("--store-limit", type=ByteSize(), default=None,
              help="Journal bytes on disk at which persistent producers are flow-controlled "
                   "(e.g. 20g; 0 = no limit) [default: store_limit of --config, else 0].")
@click.option("--http", "http", default=None, metavar="HOST:PORT",
              help="Serve /metrics, /healthz, /readyz and the web console on this HTTP address "
                   "(PORT alone binds 127.0.0.1) [default: off; config key http].")
@click.option("--ws", "ws", default=None, metavar="HOST:PORT",
              help="Also serve STOMP over WebSocket (browsers: stompjs) on this address, any path "
                   "(PORT alone binds 127.0.0.1); open only while the client port is "
                   "[default: off; config key ws; allowed browser origins: ws_allowed_origins].")
@click.option("--otel-endpoint", "otel_endpoint", default=None, metavar="URL",
              help="Export a server span per sampled SEND (with its journal fsync and replication wait) "
                   "over OTLP/HTTP to this collector, e.g. http://127.0.0.1:4318 [default: off; config key "
                   "otel_endpoint].")
@ha_options
def run(
    port: int | None,
    data_dir: str | None,
    host: str | None,
    name: str | None,
    users_file: str | None,
    config_file: str | None,
    log_level: str | None,
    store_limit: int | None,
    http: str | None,
    ws: str | None,
    otel_endpoint: str | None,
    **ha: object,
) -> None:
    """Run one broker in the foreground until SIGTERM or Ctrl-C.

    Prints `listening on stomp://HOST:PORT` on stdout once it accepts clients (and
    `http console http://HOST:PORT/` with --http, `listening on ws://HOST:PORT` with
    --ws); logs go to stderr. Stopping flushes
    the journal. Exit codes: 0 stopped, 1 cannot start, 2 bad configuration, 3 fenced
    (the journal failed, e.g. a full disk: every receipted message is on disk; restart
    once the cause is fixed).
    """
    from amqtransport.broker.config import BrokerConfig, load_users

    try:
        cfg = build_config(
            config_file=config_file,
            overrides={
                "port": port,
                "data_dir": data_dir,
                "host": host,
                "name": name,
                "users_file": users_file,
                "log_level": log_level,
                "store_limit": store_limit,
                "http": http,
                "ws": ws,
                "otel_endpoint": otel_endpoint,
            },
        )
        assert isinstance(cfg, BrokerConfig)
        users = load_users(cfg.users_file) if cfg.users_file else None
    except ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    setup_logging(cfg.log_level)
    fit_open_files(cfg.max_connections)
    if cfg.data_dir is None:
        cfg = cfg.model_copy(update={"data_dir": str(Path("amq-data").resolve())})
    # message bodies, ha-state.json, checkpoints: this user's only (dir 0700, files 0600)
    os.umask(0o077)
    try:
        private_dir(cfg.data_dir or "amq-data")
    except OSError as exc:
        click.echo(f"error: cannot create the data directory {cfg.data_dir}: {exc.strerror or exc}", err=True)
        sys.exit(1)
    tune_gc()
    if ha.get("ha"):
        sys.exit(run_ha(cfg, users, ha))
    try:
        code = asyncio.run(_serve(cfg, users))
    except KeyboardInterrupt:
        code = 0
    sys.exit(code)


async def _serve(cfg: object, users: dict[str, str] | None) -> int:
    from amqtransport.broker.config import BrokerConfig
    from amqtransport.broker.server import BrokerServer, stop_on_signals
    from amqtransport.broker.store import StoreLockedError

    assert isinstance(cfg, BrokerConfig)
    log = logging.getLogger("amqtransport.broker")
    server = BrokerServer(cfg, users=users)
    try:
        await server.open()
    except StoreLockedError as exc:
        click.echo(f"error: {exc}", err=True)
        return 1
    except OSError as exc:  # e.g. a full disk: recovery starts a new journal segment
        click.echo(f"error: cannot open the journal in {server.data_dir}: {exc}", err=True)
        return 1
    try:
        await server.listen()
    except OSError as exc:
        where = f"{cfg.host}:{cfg.port}" + (f" or ws {cfg.ws}" if cfg.ws else "")
        click.echo(f"error: cannot listen on {where}: {exc.strerror or exc}", err=True)
        await server.stop()
        return 1
    http = None
    if cfg.http:
        from amqtransport.broker.http import start_side_port
        from amqtransport.broker.ops.view import ServerView

        try:
            http = await start_side_port(ServerView(server), cfg.http, users)
        except OSError as exc:
            click.echo(f"error: cannot listen on http {cfg.http}: {exc.strerror or exc}", err=True)
            await server.stop()
            return 1
    stop = asyncio.Event()
    stop_on_signals(asyncio.get_running_loop(), stop.set, lambda: 3 if server.fenced is not None else 1)
    server.on_fenced = lambda _reason: stop.set()
    click.echo(f"listening on stomp://{server.host}:{server.port}")
    if server.ws_address is not None:
        click.echo("listening on ws://{}:{}".format(*server.ws_address))
    if http is not None:
        click.echo(f"http console {http.url}/")
    sys.stdout.flush()
    await stop.wait()
    if server.fenced is not None:
        log.error("broker fenced (%s): exiting with code 3", server.fenced)
    else:
        log.info("signal received: stopping (flushing the journal)")
    if http is not None:
        await http.stop()
    await server.stop()
    return 3 if server.fenced is not None else 0


@broker.command("witness")
@click.option("--port", type=int, required=True, help="TCP port the pairs' nodes reach the witness on.")
@click.option("--data-dir", type=click.Path(file_okay=False), required=True,
              help="Directory of the witness's durable state (witness-state.json; keep it: a witness that "
                   "lost it may grant what it granted before).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Bind address (0.0.0.0: every interface).")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
def witness_cmd(port: int, data_dir: str, host: str, log_level: str) -> None:
    """Run a witness for pairs (replicated or shared store) in the foreground until SIGTERM or Ctrl-C.

    Give both nodes of a pair `--witness HOST:PORT` (one witness serves any number of
    pairs, each known by its cluster secret): a master that loses its slave then goes on
    receipting while the witness renews its lease, and the slave takes over only with the
    witness's grant, once that lease ran out. Prints `witness listening on tcp://HOST:PORT`
    once it accepts requests. Exit codes: 0 stopped, 1 cannot start, 2 bad options.
    """
    from amqtransport.broker.ha.witness import run_witness

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


@broker.command("hash-password")
@click.argument("password", required=False)
@click.option("--user", default=None, help="Print a whole users-file line for this user.")
def hash_password_cmd(password: str | None, user: str | None) -> None:
    """Print the hashed form of PASSWORD for a users file (prompted when omitted)."""
    from amqtransport.broker.config import hash_password

    if password is None:
        password = getpass.getpass("password: ")
    hashed = hash_password(password)
    click.echo(f"{user}:{hashed}" if user else hashed)


def _register_ha() -> None:
    from amqtransport.cli.ha_cmd import pair, release, status

    broker.add_command(pair)
    broker.add_command(status)
    broker.add_command(release)


_register_ha()


def _register_journal() -> None:
    from amqtransport.cli.journal_cmd import repair, verify

    broker.add_command(verify)
    broker.add_command(repair)


_register_journal()
