"""``amq uri explain [--json] URI``: show the transport stack a URI builds.

The human form is an indented tree, one node per line, with the effective options of
every failover/static (non-default values marked ``*name=value``), the given options of every
broker URI and, for failover/static, the first delays of the reconnect schedule; below a node,
one line per ActiveMQ option it carries: what it became over STOMP, or why it is ignored.
``--json`` prints the shape in docs/uris.md (``CompositeUri.to_json``).  A bad URI prints
exactly one line ``error: ...`` on stderr and exits 2.
"""

from __future__ import annotations

import json
import re
import textwrap
from typing import Any

import click

from amqtransport.backoff import describe_failover, describe_static
from amqtransport.errors import UriError
from amqtransport.options import FailoverOptions, StaticOptions
from amqtransport.uri import CompositeUri, LeafUri, UriNode, parse_uri

__all__ = ["uri", "explain", "explain_text"]


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value) if value else "(none)"
    if value is None:
        return "(none)"
    if isinstance(value, float):
        return f"{value:g}"
    text = str(value)
    if not text or any(ch.isspace() or not ch.isprintable() for ch in text):
        return json.dumps(text)  # quoted, one line
    return text


def _lines(node: UriNode, indent: str, out: list[str]) -> None:
    if isinstance(node, LeafUri):
        given = node.options.given()
        text = f"{indent}{node.address}"
        if given:
            text += "  " + " ".join(f"*{k}={_value(v)}" for k, v in given.items())
        out.append(text)
        _meaning_lines(node, indent + "    ", out)
        return
    assert isinstance(node, CompositeUri)
    head = f"{indent}{node.scheme}"
    if node.desugared_from:
        head += f"  (from {node.desugared_from}:)"
    out.append(head)
    options = node.options
    changed = options.non_default()
    opts = " ".join(
        f"{'*' if k in changed else ''}{k}={_value(v)}" for k, v in options.effective().items()
    )
    out.extend(
        textwrap.wrap(
            opts,
            width=100,
            initial_indent=f"{indent}    options: ",
            subsequent_indent=f"{indent}             ",
            break_long_words=False,
            break_on_hyphens=False,
        )
    )
    if isinstance(options, FailoverOptions):
        out.append(f"{indent}    {describe_failover(options)}")
    elif isinstance(options, StaticOptions):
        out.append(f"{indent}    {describe_static(options)}")
    _meaning_lines(node, indent + "    ", out)
    for component in node.components:
        _lines(component, indent + "    ", out)


def _meaning_lines(node: UriNode, indent: str, out: list[str]) -> None:
    """One line per ActiveMQ option kept on ``node``: what it became, or why it is ignored."""
    for name, meaning in node.to_json().get("meanings", {}).items():
        value = "*****" if name == "jms.password" else _value(meaning["value"])
        what = f"became: {meaning['became']}" if "became" in meaning else f"ignored: {meaning['ignored']}"
        out.extend(textwrap.wrap(f"{name}={value} -> {what}", width=100, initial_indent=indent,
                                 subsequent_indent=indent + "    ", break_long_words=False,
                                 break_on_hyphens=False))


def explain_text(node: UriNode) -> str:
    """The human form of ``amq uri explain`` for a parsed tree."""
    out = [f"canonical: {node}"]
    _lines(node, "", out)
    if any(re.search(r"(^|\s)\*[A-Za-z]", line) for line in out[1:]):
        out.append("(*name = not the default)")
    return "\n".join(out)


@click.group()
def uri() -> None:
    """Parse and explain connection URIs."""


@uri.command()
@click.option("--json", "as_json", is_flag=True, help="Print the desugared tree as JSON.")
@click.argument("uri_text", metavar="URI")
@click.pass_context
def explain(ctx: click.Context, as_json: bool, uri_text: str) -> None:
    """Show the transport stack a URI builds (desugared, effective options, delays).

    Example: amq uri explain 'masterslave:(tcp://a:61613,tcp://b:61613)'
    """
    try:
        node = parse_uri(uri_text)
    except UriError as exc:
        message = " ".join(str(exc).split())
        click.echo(f"error: {message}", err=True)
        ctx.exit(2)
    if as_json:
        click.echo(json.dumps(node.to_json(), indent=2))
    else:
        click.echo(explain_text(node))
