"""``amq send``, ``amq recv`` and ``amq browse``: the seed's ``artemis producer``/``consumer`` check.

``amq send URI DEST --count N`` sends N messages through the URI with pipelined
receipts (``--window``) and exits 0 only when every one was receipted. Each message
carries the idempotency key ``<run id>-<n>`` so replays after a failover are dropped by
brokers that honour it. ``amq recv URI DEST --count N`` receives N distinct messages
(client-individual acks, so whatever it does not count stays on the broker), drops
redelivered copies with the client's duplicate filter and exits non-zero when fewer
than N arrive before ``--timeout`` seconds pass without a message.

Both show a progress bar on a terminal (stderr) and print a JSON summary with
``--json``: ``{"sent", "seconds", "rate", ...}`` / ``{"received", "duplicates",
"seconds", ...}``. Errors print one ``error: ...`` line; exit 2 for a bad URI.

``amq browse URI QUEUE`` prints the bodies of the messages the queue holds, in order,
consuming nothing (``conn.browse``: ``browser:true``, ActiveMQ and our broker), or with
``--json`` one summary ``{"browsed", "destination", "messages": [{"message_id",
"bytes", "headers"}], ...}``; ``--selector`` shows only matching messages, ``--count``
at most that many.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from amqtransport.client import Connection, connect
from amqtransport.errors import AmqTransportError, UriError

__all__ = ["browse", "recv", "send"]

log = logging.getLogger("amqtransport.cli")


class _Counter:
    """Listener counting failovers for the summary."""

    def __init__(self) -> None:
        self.interruptions = 0
        self.addresses: list[str] = []

    def on_interrupted(self, error: BaseException) -> None:
        self.interruptions += 1
        click.echo(f"warning: link lost: {error}", err=True)

    def on_resumed(self, address: str) -> None:
        self.addresses.append(address)
        click.echo(f"resumed on {address}", err=True)


class _NoBar:
    def update(self, n: int) -> None:
        pass


@contextmanager
def _bar(count: int, label: str, show: bool | None) -> Iterator[Any]:
    if show is None:
        show = sys.stderr.isatty()
    if not show:
        yield _NoBar()
        return
    with click.progressbar(length=count, label=label, file=sys.stderr, show_pos=True) as bar:
        yield bar


def _open(uri: str, login: str | None, passcode: str | None, vhost: str | None, listener: _Counter) -> Connection:
    try:
        conn = connect(uri, login=login, passcode=passcode, vhost=vhost, listener=listener)
    except UriError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except AmqTransportError as exc:
        click.echo(f"error: cannot connect: {exc}", err=True)
        sys.exit(1)
    log.info("connected to %s (%s, dialect %s)", conn.connected_uri, conn.server or "no server header", conn.dialect)
    return conn


def _link_info(conn: Connection) -> dict[str, Any]:
    """What the summary says about the broker: address, ``server`` header, dialect."""
    return {"connected": conn.connected_uri, "server": conn.server, "dialect": conn.dialect}


def _body(prefix: str, i: int, size: int) -> bytes:
    head = f"{prefix}-{i}".encode()
    if size <= len(head):
        return head
    return head + b" " + b"x" * (size - len(head) - 1)


_common = [
    click.argument("uri"),
    click.argument("destination"),
    click.option("--count", "-n", type=click.IntRange(min=0), default=1000, show_default=True,
                 help="How many messages."),
    click.option("--login", "-u", default=None, help="STOMP login."),
    click.option("--passcode", "-p", default=None, help="STOMP passcode."),
    click.option("--vhost", default=None,
                 help="Virtual host (the CONNECT host header; RabbitMQ's vhost) [default: the URI's, else /]."),
    click.option("--json", "as_json", is_flag=True, help="Print a JSON summary on stdout."),
    click.option("--progress/--no-progress", default=None, help="Progress bar (default: on a terminal)."),
]


def _apply(fn: Any) -> Any:
    for deco in reversed(_common):
        fn = deco(fn)
    return fn


@click.command("send")
@_apply
@click.option("--size", type=click.IntRange(min=0), default=0, help="Body size in bytes (default: just the id).")
@click.option("--window", type=click.IntRange(min=1), default=100, show_default=True,
              help="Receipts outstanding at once.")
@click.option("--non-persistent", is_flag=True, help="Send with persistent:false.")
@click.option("--id-prefix", default=None, help="Idempotency-key prefix (default: a fresh run id).")
@click.option("--priority", type=click.IntRange(0, 9), default=None, metavar="N",
              help="JMS priority 0-9 of every message (higher is delivered first; the broker's default is 4).")
@click.option("--delay", "delay_ms", type=click.IntRange(min=0), default=None, metavar="MS",
              help="Deliver each message MS milliseconds later (AMQ_SCHEDULED_DELAY: ActiveMQ's scheduler, ours).")
def send(uri: str, destination: str, count: int, login: str | None, passcode: str | None, vhost: str | None,
         as_json: bool, progress: bool | None, size: int, window: int, non_persistent: bool,
         id_prefix: str | None, priority: int | None, delay_ms: int | None) -> None:
    """Send COUNT messages to DESTINATION through URI; exit 0 only if all were receipted."""
    prefix = id_prefix or uuid.uuid4().hex[:12]
    counter = _Counter()
    conn = _open(uri, login, passcode, vhost, counter)
    info = _link_info(conn)
    sent = 0
    start = time.monotonic()
    error: BaseException | None = None
    try:
        with _bar(count, "sending", progress) as bar:
            producer = conn.producer(window=window)
            last = 0
            for i in range(count):
                producer.send(destination, _body(prefix, i, size), persistent=not non_persistent,
                              idempotency_key=f"{prefix}-{i}", priority=priority, delay=delay_ms)
                if producer.receipted > last:
                    bar.update(producer.receipted - last)
                    last = producer.receipted
            producer.flush()
            bar.update(producer.receipted - last)
            sent = producer.receipted
    except AmqTransportError as exc:
        error = exc
    finally:
        seconds = time.monotonic() - start
        if conn.connected_uri is not None:
            info = _link_info(conn)
        conn.close()
    summary = {"sent": sent, "requested": count, "seconds": round(seconds, 3),
               "rate": round(sent / seconds, 1) if seconds > 0 else 0.0, "destination": destination,
               **info, "failovers": counter.interruptions, "id_prefix": prefix}
    if error is not None:
        summary["error"] = str(error)
        click.echo(f"error: {error}", err=True)
    if as_json:
        click.echo(json.dumps(summary))
    elif error is None:
        click.echo(f"sent {sent} messages in {seconds:.2f} s ({summary['rate']} msg/s), all receipted")
    sys.exit(0 if error is None and sent == count else 1)


@click.command("recv")
@_apply
@click.option("--timeout", "-t", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="Give up after this many seconds without a message.")
@click.option("--ack", type=click.Choice(["client-individual", "client", "auto"]), default="client-individual",
              show_default=True, help="Ack mode.")
@click.option("--print", "print_bodies", is_flag=True, help="Print each body on stdout.")
@click.option("--selector", default=None, metavar="EXPR",
              help="A JMS message selector: receive only matching messages (e.g. \"color = 'red'\").")
def recv(uri: str, destination: str, count: int, login: str | None, passcode: str | None, vhost: str | None,
         as_json: bool, progress: bool | None, timeout: float, ack: str, print_bodies: bool,
         selector: str | None) -> None:
    """Receive COUNT distinct messages from DESTINATION; exit non-zero when fewer arrive."""
    counter = _Counter()
    conn = _open(uri, login, passcode, vhost, counter)
    info = _link_info(conn)
    received = 0
    start = time.monotonic()
    error: BaseException | None = None
    try:
        sub = conn.subscribe(destination, ack=ack, prefetch=max(1, min(count, 1000)),  # type: ignore[arg-type]
                             selector=selector)
        with _bar(count, "receiving", progress) as bar:
            while received < count:
                msg = sub.receive(timeout)
                if msg is None:
                    break
                received += 1
                if print_bodies:
                    click.echo(msg.body.decode("utf-8", "replace"))
                msg.ack()
                bar.update(1)
    except AmqTransportError as exc:
        error = exc
    finally:
        seconds = time.monotonic() - start
        duplicates = conn.duplicates
        if conn.connected_uri is not None:
            info = _link_info(conn)
        conn.close()
    summary = {"received": received, "requested": count, "duplicates": duplicates, "seconds": round(seconds, 3),
               "rate": round(received / seconds, 1) if seconds > 0 else 0.0, "destination": destination,
               **info, "failovers": counter.interruptions}
    if error is not None:
        summary["error"] = str(error)
        click.echo(f"error: {error}", err=True)
    elif received < count:
        click.echo(f"error: only {received} of {count} messages arrived (no message for {timeout:g} s)", err=True)
    if as_json:
        click.echo(json.dumps(summary))
    elif received == count:
        click.echo(f"received {received} messages in {seconds:.2f} s ({duplicates} duplicates dropped)")
    sys.exit(0 if error is None and received == count else 1)


@click.command("browse")
@click.argument("uri")
@click.argument("destination")
@click.option("--count", "-n", type=click.IntRange(min=1), default=None, help="Show at most this many [default: all].")
@click.option("--selector", default=None, metavar="EXPR",
              help="A JMS message selector: show only matching messages (e.g. \"color = 'red'\").")
@click.option("--timeout", "-t", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="Give up after this many seconds without a message or the end of the browse.")
@click.option("--login", "-u", default=None, help="STOMP login.")
@click.option("--passcode", "-p", default=None, help="STOMP passcode.")
@click.option("--vhost", default=None, help="Virtual host (the CONNECT host header) [default: the URI's, else /].")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary (message ids, sizes, headers) on stdout.")
def browse(uri: str, destination: str, count: int | None, selector: str | None, timeout: float, login: str | None,
           passcode: str | None, vhost: str | None, as_json: bool) -> None:
    """Show the messages queue DESTINATION holds, in order; nothing is consumed."""
    conn = _open(uri, login, passcode, vhost, _Counter())
    shown: list[dict[str, Any]] = []
    error: BaseException | None = None
    try:
        for msg in conn.browse(destination, selector=selector, timeout=timeout):
            shown.append({"message_id": msg.message_id, "bytes": len(msg.body), "headers": msg.headers})
            if not as_json:
                click.echo(msg.body.decode("utf-8", "replace"))
            if count is not None and len(shown) >= count:
                break
    except AmqTransportError as exc:
        error = exc
    finally:
        info = _link_info(conn)
        conn.close()
    if error is not None:
        click.echo(f"error: {error}", err=True)
    if as_json:
        summary = {"browsed": len(shown), "destination": destination, "selector": selector, **info,
                   "messages": shown}
        if error is not None:
            summary["error"] = str(error)
        click.echo(json.dumps(summary))
    sys.exit(0 if error is None else 1)
