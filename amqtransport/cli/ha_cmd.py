"""HA parts of ``amq broker``: the ``--ha`` options of ``run``, ``pair`` and ``status``.

``amq broker run --ha replicated|shared-store ...`` runs one node of a pair
(:mod:`amqtransport.broker.ha.node`); ``amq broker pair`` starts both nodes as child
processes and prints the URI to use; ``amq broker status --port P`` asks a broker for
its role, message counts, connections and memory: a plain ``amq broker run`` broker
answers on its client port with role ``standalone``; an HA node (on its client port
when it is master, or on its HA port in any role) adds its epoch and peer.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from amqtransport.broker.ha.auth import HaRequest
    from amqtransport.stomp import Frame

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["ha_options", "run_ha", "pair", "release", "status", "status_data", "status_lines"]


def ha_options(fn: F) -> F:
    """Add the HA options to ``amq broker run`` (values arrive as keyword arguments)."""
    opts = [
        click.option("--ha", "ha", type=click.Choice(["shared-store", "replicated"]), default=None,
                     help="Run as one node of a master/slave pair."),
        click.option("--ha-port", type=int, default=None,
                     help="HA port (status + replication), bound in every role [default: any free port]."),
        click.option("--master-connector", default=None,
                     help="Replicated: start as slave of this master (tcp://HOST:PORT, its client or HA port)."),
        click.option("--master-user", default=None, help="Login for the replication link."),
        click.option("--master-password", default=None,
                     help="Passcode for the replication link (visible in ps: prefer --master-password-file or "
                          "the AMQ_MASTER_PASSWORD environment variable)."),
        click.option("--master-password-file", default=None, type=click.Path(dir_okay=False),
                     help="File holding the passcode for the replication link (first line)."),
        click.option("--wait-for-slave", is_flag=True, default=None,
                     help="Master: no client port until a slave has synced."),
        click.option("--shutdown-on-slave-failure", is_flag=True, default=None,
                     help="Master: stop (and refuse receipts) when the synced slave is lost."),
        click.option("--shutdown-on-master-failure", is_flag=True, default=None,
                     help="Slave: do not take over; stop as a cold backup when the master is lost."),
        click.option("--allow-failback", is_flag=True, default=None,
                     help="Shared store: hand the store back when the primary node returns."),
        click.option("--lock-interval", type=float, default=None,
                     help="Seconds between lock polls / decision rounds [default: 0.1]."),
        click.option("--link-timeout", type=float, default=None,
                     help="Seconds without an ack/ping before the replication link counts as dead [default: 2]."),
        click.option("--takeover-check", default=None,
                     help="HOST:PORT both nodes must reach; a slave takes over only if it answers."),
        click.option("--witness", default=None, metavar="HOST:PORT",
                     help="The pair's witness (amq broker witness). Replicated: a master that loses its slave "
                          "receipts alone on its lease, a slave takes over only with its grant [default: none, "
                          "the master holds receipts until the peer answers; config key witness in [ha]]. "
                          "Shared store: mastership is its lease instead of the lock file, so a frozen master "
                          "is replaced (needs the cluster secret too)."),
        click.option("--relay-port", type=int, default=None, metavar="PORT",
                     help="A node that is not master but knows a live master (a slave with its replication link "
                          "up, a shared-store standby that sees the master) binds this port and relays each client "
                          "to the master's client port; clients list the relay ports after the client ports in "
                          "their failover URI, as a last resort (0: a free port, printed in the log) [default: no "
                          "relay; config key relay_port]."),
        click.option("--cluster-password-file", default=None, type=click.Path(dir_okay=False),
                     help="Replicated (or with --witness): file holding the pair's shared secret (both nodes, "
                          "same content); "
                          "every replication/demote request is signed with it."),
        click.option("--cluster-password", default=None,
                     help="Replicated: the pair's shared secret itself (visible in ps: prefer the file)."),
    ]
    @functools.wraps(fn)
    def with_config_table(**kwargs: Any) -> Any:
        # the config file's [ha] table fills in what the command line did not set
        config_file = kwargs.get("config_file")
        if config_file:
            from amqtransport.broker.ha.config import load_ha_table
            from amqtransport.errors import ConfigError

            try:
                table = load_ha_table(config_file)
            except ConfigError as exc:
                click.echo(f"error: {exc}", err=True)
                sys.exit(2)
            for key, value in table.items():
                name = "ha" if key == "mode" else key
                if kwargs.get(name) is None:
                    kwargs[name] = value
        return fn(**kwargs)

    wrapped: Any = with_config_table
    for opt in reversed(opts):
        wrapped = opt(wrapped)
    return wrapped  # type: ignore[no-any-return]


def run_ha(cfg: object, users: Mapping[str, str] | None, ha: Mapping[str, Any]) -> int:
    """Run one HA node (called by ``amq broker run`` when ``--ha`` is given)."""
    from amqtransport.broker.config import BrokerConfig
    from amqtransport.broker.ha.config import options_from_kwargs
    from amqtransport.broker.ha.node import run_node
    from amqtransport.errors import ConfigError

    assert isinstance(cfg, BrokerConfig)
    kwargs = {("mode" if k == "ha" else k): v for k, v in ha.items()}
    if kwargs.get("witness") is None and cfg.witness is not None:  # the [broker] key (the [ha] one fills kwargs)
        kwargs["witness"] = cfg.witness
    if kwargs.get("relay_port") is None and cfg.relay_port is not None:  # the [broker] key, as witness
        kwargs["relay_port"] = cfg.relay_port
    try:
        kwargs["master_password"] = replication_passcode(kwargs.pop("master_password", None),
                                                         kwargs.pop("master_password_file", None),
                                                         user=kwargs.get("master_user"))
        if cfg.port == 0:
            raise ConfigError("--ha needs a fixed --port (clients list both nodes' ports)")
        options = options_from_kwargs(kwargs)
        options.validate()
        if options.relay_port and options.relay_port == cfg.port:
            raise ConfigError(f"--relay-port must differ from the client port --port, both are {cfg.port}")
    except ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        return 2
    return run_node(cfg, users, options)


#: the environment variable that gives the replication link's passcode (not in ps)
PASSWORD_ENV = "AMQ_MASTER_PASSWORD"


def replication_passcode(value: object, path: object, *, user: object) -> str | None:
    """The replication link's passcode: ``--master-password`` (visible in ps), else the
    first line of ``--master-password-file``, else ``$AMQ_MASTER_PASSWORD`` (when a
    ``user`` is given); ConfigError when both options are given or the file cannot be read."""
    from amqtransport.errors import ConfigError

    if value is not None and path is not None:
        raise ConfigError("give --master-password or --master-password-file, not both", path="master_password")
    if path is not None:
        try:
            lines = Path(str(path)).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise ConfigError(f"--master-password-file {path}: {exc.strerror or exc}",
                              path="master_password_file") from None
        return lines[0] if lines else ""
    if value is not None:
        return str(value)
    return os.environ.get(PASSWORD_ENV) if user is not None else None


@click.command("pair")
@click.option("--mode", type=click.Choice(["replicated", "shared-store"]), default="replicated", show_default=True)
@click.option("--port", type=int, default=61613, show_default=True, help="Client port of the first master.")
@click.option("--slave-port", type=int, default=61614, show_default=True, help="Client port of the slave.")
@click.option("--data-dir", type=click.Path(file_okay=False), default="amq-pair-data", show_default=True)
@click.option("--users", "users_file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="users file for both nodes (the replication link then needs --master-user and its passcode: "
                   "--master-password-file, $AMQ_MASTER_PASSWORD or --master-password).")
@click.option("--master-user", default=None, help="Login of the replication link (a user of --users).")
@click.option("--master-password", default=None,
              help="Its passcode (visible in ps: prefer --master-password-file or $AMQ_MASTER_PASSWORD; the nodes "
                   "get it in a file either way).")
@click.option("--master-password-file", default=None, type=click.Path(dir_okay=False, exists=True),
              help="File holding the replication link's passcode (first line).")
@click.option("--takeover-check", default=None, help="HOST:PORT both nodes must reach to take over.")
@click.option("--witness", default=None, metavar="HOST:PORT",
              help="Both nodes use this witness (amq broker witness) [default: none].")
@click.option("--relay-port", type=int, default=None,
              help="Relay port of node a: while not master it relays clients to the master there (amq broker run "
                   "--relay-port; the printed uri lists it after the client ports) [default: no relay].")
@click.option("--slave-relay-port", type=int, default=None, help="Relay port of node b [default: as --relay-port].")
@click.option("--cluster-password-file", default=None, type=click.Path(dir_okay=False, exists=True),
              help="Replicated (or with --witness): the pair's shared secret [default: DATA_DIR/cluster.secret, "
                   "generated once].")
@click.option("--http-port", type=int, default=None,
              help="HTTP side port of the first master (console, /metrics, /healthz, /readyz on 127.0.0.1) "
                   "[default: off].")
@click.option("--slave-http-port", type=int, default=None, help="HTTP side port of the slave [default: off].")
@click.option("--ws-port", type=int, default=None,
              help="STOMP over WebSocket port of the first master on 127.0.0.1 (browsers: stompjs); like the client "
                   "port, open only on the node that is master [default: off].")
@click.option("--slave-ws-port", type=int, default=None, help="WebSocket port of the slave [default: off].")
@click.option("--ha-port", type=int, default=None,
              help="HA port of node a (status, release, replication) [default: the earlier run's, kept in "
                   "DATA_DIR/pair.json, else a free one].")
@click.option("--slave-ha-port", type=int, default=None, help="HA port of node b [default: as --ha-port].")
def pair(
    mode: str,
    port: int,
    slave_port: int,
    data_dir: str,
    users_file: str | None,
    master_user: str | None,
    master_password: str | None,
    master_password_file: str | None,
    takeover_check: str | None,
    witness: str | None,
    relay_port: int | None,
    slave_relay_port: int | None,
    cluster_password_file: str | None,
    http_port: int | None,
    slave_http_port: int | None,
    ws_port: int | None,
    slave_ws_port: int | None,
    ha_port: int | None,
    slave_ha_port: int | None,
) -> None:
    """Start a master/slave pair as two child processes; Ctrl-C stops both.

    Replicated: both nodes start at once on the data in --data-dir and their HA
    decision picks the master (on a new directory node a; on the data of an earlier
    run the node with the newer data -- after a master kill, the slave that took over
    -- and the other joins as slave), so the same command starts the pair again after
    any earlier run, kill or reboot; the nodes' HA ports are kept in DATA_DIR/pair.json
    from run to run. Shared store: a starts first and takes the lock.

    Prints each node's output as it comes, then the client URI and each node's role
    and pid. Kill the master's pid and the slave takes over; the line `pair` prints
    then restarts it (it rejoins as slave); Ctrl-C stops every node of the pair, one
    restarted by hand included. Logs: DATA_DIR/logs/a-N.log, b-N.log (earlier runs'
    logs are kept).
    """
    import shlex
    import threading

    from amqtransport.processes.pair import BrokerPair, load_ports, port_in_use, save_ports

    lock = threading.Lock()

    def say(text: str) -> None:
        with lock:
            click.echo(text)
            sys.stdout.flush()

    extra: list[str] = []
    if users_file:
        extra += ["--users", users_file]
    http = {"a": http_port, "b": slave_http_port}
    ws = {"a": ws_port, "b": slave_ws_port}
    for what, value in (("--http-port", http_port), ("--slave-http-port", slave_http_port),
                        ("--ws-port", ws_port), ("--slave-ws-port", slave_ws_port),
                        ("--ha-port", ha_port), ("--slave-ha-port", slave_ha_port),
                        ("--relay-port", relay_port), ("--slave-relay-port", slave_relay_port)):
        if value is not None and not 0 < value < 65536:
            click.echo(f"error: {what} must be a port number (1-65535), got {value}", err=True)
            sys.exit(2)
    if (ha_port is None) != (slave_ha_port is None):
        click.echo("error: --ha-port and --slave-ha-port go together", err=True)
        sys.exit(2)
    if ha_port is not None and len({port, slave_port, ha_port, slave_ha_port}) < 4:
        click.echo(f"error: the client and HA ports must differ, got {port}, {slave_port}, {ha_port}, "
                   f"{slave_ha_port}", err=True)
        sys.exit(2)
    if (relay_port is None) != (slave_relay_port is None):
        click.echo("error: --relay-port and --slave-relay-port go together", err=True)
        sys.exit(2)
    relay_ports: tuple[int, ...] = ()
    if relay_port is not None and slave_relay_port is not None:
        relay_ports = (relay_port, slave_relay_port)
        taken = {port, slave_port, *((ha_port, slave_ha_port) if ha_port is not None else ())}
        if len({relay_port, slave_relay_port}) < 2 or taken & set(relay_ports):
            click.echo(f"error: the relay ports must differ from each other and from the client and HA ports, got "
                       f"{relay_port}, {slave_relay_port}", err=True)
            sys.exit(2)
    from amqtransport.errors import ConfigError

    try:
        password = replication_passcode(master_password, master_password_file, user=master_user)
    except ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    if (master_user is None) != (password is None):
        click.echo("error: --master-user and its passcode (--master-password-file, $AMQ_MASTER_PASSWORD or "
                   "--master-password) go together", err=True)
        sys.exit(2)
    os.umask(0o077)  # the pair's files (logs, pair.json, the passcode file) are private to this user
    ha_ports: tuple[int, ...] = ()
    if ha_port is not None and slave_ha_port is not None:
        ha_ports = (ha_port, slave_ha_port)
    else:
        ha_ports = _earlier_ha_ports(data_dir, (port, slave_port), load_ports, port_in_use, say)
    bp = BrokerPair(
        mode, Path(data_dir).resolve(), port=port, slave_port=slave_port, master_user=master_user,
        master_password=password, takeover_check=takeover_check, witness=witness, extra_args=extra,
        relay_ports=relay_ports,
        cluster_password_file=cluster_password_file, ha_ports=ha_ports,
        master_args=[*(["--http", f"127.0.0.1:{http_port}"] if http_port else []),
                     *(["--ws", f"127.0.0.1:{ws_port}"] if ws_port else [])],
        slave_args=[*(["--http", f"127.0.0.1:{slave_http_port}"] if slave_http_port else []),
                    *(["--ws", f"127.0.0.1:{slave_ws_port}"] if slave_ws_port else [])],
    )
    save_ports(bp)
    stop = {"flag": False}

    def on_signal(_sig: int, _frame: object) -> None:
        stop["flag"] = True
        raise KeyboardInterrupt

    def relay(node: Any, line: str) -> None:
        say(f"node {node.name} (pid {node.proc.pid if node.proc else '?'}): {line}")

    for node in bp.nodes:
        node.on_line = relay
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    if mode == "replicated":
        say(f"starting nodes a and b on the data in {bp.data_dir} (the node with the newer data becomes master; "
            f"logs {bp.a.next_log_path}, {bp.b.next_log_path.name})")
    else:
        say(f"starting node a, then b, on the shared store in {bp.data_dir}/store")
    try:
        bp.start(together=True)
    except BaseException as exc:
        for sig in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C must not cut the stop short
            signal.signal(sig, signal.SIG_IGN)
        _stop_pair(bp, say)
        why = "interrupted" if isinstance(exc, KeyboardInterrupt) else str(exc)
        click.echo(f"error: the pair did not start: {why}", err=True)
        sys.exit(1)
    try:
        say(f"uri: {bp.uri}")
        if bp.cluster_password_file is not None:
            say(f"cluster secret: {bp.cluster_password_file} (both nodes sign their HA requests with it)")
        for node in bp.nodes:
            console = f" console http://127.0.0.1:{http[node.name]}/" if http[node.name] else ""
            websocket = f" websocket ws://127.0.0.1:{ws[node.name]}/ws" if ws[node.name] else ""
            relay_at = f" relay-port {node.relay_uri}" if node.relay_port is not None else ""
            say(f"node {node.name}: role {node.role} pid {node.pid} client {node.uri} "
                f"ha-port tcp://{node.host}:{node.ha_port}{relay_at}{console}{websocket} data {node.data_dir} "
                f"log {node.log_path}")
        say("Ctrl-C stops both nodes.")
        alive = {n.name: True for n in bp.nodes}
        by_hand: dict[str, int | None] = {n.name: None for n in bp.nodes}
        ticks = 0
        while not stop["flag"]:
            time.sleep(0.2)
            ticks += 1
            for node in bp.nodes:
                if alive[node.name] != node.alive:
                    alive[node.name] = node.alive
                    if node.alive:
                        say(f"node {node.name}: running again, pid {node.pid}")
                    else:
                        code = node.proc.returncode if node.proc else None
                        say(f"node {node.name}: pid {node.proc.pid if node.proc else '?'} exited "
                            f"(code {code}); restart it with: {shlex.join(node.command())}")
                if not node.alive and ticks % 5 == 0:  # restarted by hand with that line?
                    pid = node.foreign_pid(0.5)
                    if pid != by_hand[node.name]:
                        if pid is not None:
                            say(f"node {node.name}: running again (restarted by hand), pid {pid}; "
                                "Ctrl-C stops it too")
                        else:
                            say(f"node {node.name}: pid {by_hand[node.name]} (restarted by hand) is gone")
                        by_hand[node.name] = pid
    except KeyboardInterrupt:
        pass
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C must not cut the stop short
            signal.signal(sig, signal.SIG_IGN)
        _stop_pair(bp, say)


def _earlier_ha_ports(data_dir: str, client_ports: tuple[int, int], load_ports: Callable[[str], Any],
                      in_use: Callable[[int], bool], say: Callable[[str], None]) -> tuple[int, ...]:
    """The HA ports of the earlier run on ``data_dir`` when they can be bound again (each
    node's peer knows them from its ``ha-state.json``); () for new ones. Exits when a
    node of an earlier run still runs there (it would hold the ports and the store)."""
    from amqtransport.broker.ha.wire import ha_request_sync

    known = load_ports(data_dir)
    if not known:
        return ()
    wanted = (known["a"]["ha_port"], known["b"]["ha_port"])
    for name, ha_port in zip("ab", wanted, strict=True):
        try:
            st = dict(ha_request_sync("127.0.0.1", ha_port, 1.0).headers)
        except Exception:  # noqa: BLE001 - nothing (of ours) answers there
            continue
        if st.get("amq-ha-name") == name:
            pid = st.get("amq-ha-pid", "?")
            click.echo(f"error: node {name} of an earlier run on {data_dir} is still running (pid {pid}, role "
                       f"{st.get('amq-ha-role')}, ha-port {ha_port}): stop it first (kill {pid})", err=True)
            sys.exit(1)
    from amqtransport.processes.ports import reserve_port

    # reserved like free_port's ports, so that no other process of ours hands them out meanwhile
    if len({*wanted, *client_ports}) < 4 or any(in_use(p) or not reserve_port(p) for p in wanted):
        say(f"warning: the HA ports of the earlier run ({wanted[0]}, {wanted[1]}) are taken or clash with the "
            "client ports: picking new ones (if the nodes cannot find each other, start them by hand: docs/ha.md)")
        return ()
    return wanted


def _stop_pair(bp: Any, say: Callable[[str], None]) -> None:
    """Stop every node of the pair (ours and any restarted by hand) and say which."""
    done = bp.stop()
    stopped = [f"{name} (pid {pid})" for name, pid, ok in done if ok]
    left = [f"node {name} pid {pid}" for name, pid, ok in done if not ok]
    absent = [n.name for n in bp.nodes if n.name not in {name for name, _pid, _ok in done}]
    text = "stopped both nodes: " + (", ".join(stopped) or "none was running")
    if absent and stopped:
        text += f"; {' and '.join(absent)} was not running"
    say(text)
    if left:
        say(f"warning: left running (could not stop): {', '.join(left)}")


@click.command("status")
@click.option("--port", type=int, required=True,
              help="The broker's client port (a plain broker, an HA master), or an HA node's HA port.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--timeout", type=float, default=3.0, show_default=True)
@click.option("--user", default=None, help="Login (a broker with users lists queue names only to a valid login).")
@click.option("--password", default=None, help="Passcode for --user.")
@click.option("--wait", "wait_s", type=float, default=0.0, show_default=True, metavar="SECONDS",
              help="While nothing listens on the port, keep trying for up to SECONDS (a slave "
                   "opens its client port only once it has taken over).")
def status(port: int, host: str, as_json: bool, timeout: float, user: str | None, password: str | None,
           wait_s: float) -> None:
    """Role, message counts, connections and memory of one broker.

    A plain broker reports role ``standalone``; an HA node its role (master, slave,
    waiting...), epoch and peer.
    """
    creds = {"login": user or "", "passcode": password or ""} if user is not None else {}
    deadline = time.monotonic() + max(0.0, wait_s)
    while True:
        try:
            frame = _ask(host, port, timeout, creds, refused_raises=time.monotonic() < deadline)
            break
        except ConnectionRefusedError:
            time.sleep(0.1)
    info = {k[len("amq-ha-"):]: v for k, v in frame.headers if k.startswith("amq-ha-")}
    if not info:
        click.echo(f"error: {host}:{port} answered without status headers: not an amqtransport broker "
                   "(or one too old to report its status)", err=True)
        sys.exit(1)
    data = status_data(info)
    if as_json:
        click.echo(json.dumps(data, sort_keys=True))
        return
    for line in status_lines(data):
        click.echo(line)


def _ask(host: str, port: int, timeout: float, headers: Mapping[str, str] | HaRequest, *,
         refused_raises: bool = False) -> Frame:
    """One HA request (status + ``headers``); its CONNECTED answer, or exit 1 saying why not
    (``refused_raises``: a refused connection raises ConnectionRefusedError, to try again)."""
    from amqtransport.broker.ha.wire import ha_request_sync

    try:
        frame = ha_request_sync(host, port, timeout, headers)
    except ConnectionRefusedError:
        if refused_raises:
            raise
        click.echo(f"error: cannot reach {host}:{port}: nothing is listening there (connection refused); "
                   "is the broker running?", err=True)
        sys.exit(1)
    except (OSError, TimeoutError) as exc:
        click.echo(f"error: cannot reach {host}:{port}: {exc}", err=True)
        sys.exit(1)
    if frame.command != "CONNECTED":
        click.echo(f"error: {host}:{port} answered {frame.command}: {frame.get('message')}", err=True)
        sys.exit(1)
    return frame


@click.command("release")
@click.option("--port", type=int, required=True,
              help="The master's HA port (a suspect master, the one to release, closes its client port).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--cluster-password-file", type=click.Path(dir_okay=False), default=None,
              help="The pair's cluster secret (as given to the nodes) [default: amq-pair-data/cluster.secret, "
                   "where `amq broker pair` keeps it, if it exists].")
@click.option("--cluster-password", default=None, help="The pair's cluster secret itself (visible in ps).")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (it asks on stdin otherwise).")
@click.option("--timeout", type=float, default=3.0, show_default=True)
def release(port: int, host: str, cluster_password_file: str | None, cluster_password: str | None, yes: bool,
            timeout: float) -> None:
    """Tell a replicated master that holds its receipts because it cannot reach its peer
    (status field 'suspect') that the peer is gone for good, so it receipts alone again.

    Only for a peer whose host is dead or cut off for good: if the peer is in fact alive
    and took over, this makes two masters, and what this one receipts from now on is
    lost when they meet. A peer whose process is merely stopped needs no release (its
    refused port is an answer).
    """
    from amqtransport.broker.ha.auth import HaRequest, RequestSigner, load_secret
    from amqtransport.broker.ha.wire import RELEASE_HEADER
    from amqtransport.errors import ConfigError
    from amqtransport.processes.pair import SECRET_FILE

    pair_secret = Path("amq-pair-data") / SECRET_FILE
    if cluster_password is None and cluster_password_file is None and pair_secret.exists():
        cluster_password_file = str(pair_secret)
    if cluster_password is None and cluster_password_file is None:
        click.echo("error: no cluster secret: give --cluster-password-file (a pair started with `amq broker pair` "
                   f"keeps it in its data directory: DATA_DIR/{SECRET_FILE})", err=True)
        sys.exit(2)
    if cluster_password_file is not None and not Path(cluster_password_file).is_file():
        click.echo(f"error: --cluster-password-file {cluster_password_file}: no such file (a pair started with "
                   f"`amq broker pair` keeps its secret in its data directory: DATA_DIR/{SECRET_FILE}, by default "
                   f"{pair_secret})", err=True)
        sys.exit(2)
    try:
        secret = load_secret(cluster_password, cluster_password_file)
    except ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    if not yes:
        click.confirm(f"Release the receipts held by the master at {host}:{port}, declaring its peer gone?",
                      abort=True)
    headers = {RELEASE_HEADER: "operator", "amq-ha-epoch": "0", "amq-ha-client": "", "amq-ha-port": ""}
    frame = _ask(host, port, timeout, HaRequest(RELEASE_HEADER, headers, RequestSigner(secret)))
    click.echo(f"released: node {frame.get('amq-ha-name')} (epoch {frame.get('amq-ha-epoch')}) receipts alone again")


def status_data(info: Mapping[str, str]) -> dict[str, object]:
    """Status headers (``amq-ha-`` prefix removed) as typed values: ints, floats, booleans,
    ``depths`` as a dict, the ``memory-*`` headers as one ``memory`` dict (``usage``,
    ``limit``, ``peak``, ``flow_control``), like ``BrokerServer.stats()["memory"]``."""
    data: dict[str, object] = {}
    memory: dict[str, object] = {}
    for k, v in info.items():
        value: object = v
        if k == "depths":
            try:
                value = json.loads(v)
            except ValueError:
                value = v
        elif v.isdigit():
            value = int(v)
        elif v in ("true", "false"):
            value = v == "true"
        elif k == "uptime":
            try:
                value = float(v)
            except ValueError:
                value = v
        if k.startswith("memory-"):
            memory[k[len("memory-"):].replace("-", "_")] = value
        else:
            data[k] = value
    if memory:
        data["memory"] = memory
    return data


_FIRST = ("role", "name", "mode", "epoch", "client", "port", "peer", "peer-state", "pid", "uptime",
          "messages", "connections", "sent", "queues", "topics")


def _size(n: object) -> str:
    if not isinstance(n, int):
        return str(n)
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= factor:
            return f"{n / factor:.1f} {unit}"
    return f"{n} B"


def status_lines(data: Mapping[str, object]) -> list[str]:
    """The human form of :func:`status_data`: one ``key value`` line each, role first."""
    lines: list[str] = []
    rest = dict(data)
    for k in _FIRST:
        if k in rest:
            v = rest.pop(k)
            lines.append(f"{k:12} {v} s" if k == "uptime" else f"{k:12} {v}")
    memory = rest.pop("memory", None)
    if isinstance(memory, dict):
        usage, limit = memory.get("usage"), memory.get("limit")
        pct = f" ({100.0 * usage / limit:.1f}%)" if isinstance(usage, int) and isinstance(limit, int) and limit else ""
        peak = memory.get("peak")
        flow = memory.get("flow_control")
        lines.append(f"{'memory':12} {_size(usage)} of {_size(limit)}{pct}, peak {_size(peak)}, "
                     f"flow control {'ENGAGED' if flow else 'off'}")
    depths = rest.pop("depths", None)
    omitted = rest.pop("depths-omitted", None)
    for k in sorted(rest):
        lines.append(f"{k:12} {rest[k]}")
    if isinstance(depths, dict) and depths:
        lines.append("queue depths:")
        width = max(len(str(q)) for q in depths)
        for q, n in sorted(depths.items(), key=lambda t: (-t[1], t[0])):
            lines.append(f"  {q:{width}} {n}")
        if omitted:
            lines.append(f"  ... and {omitted} more queues")
    return lines
