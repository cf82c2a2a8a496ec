"""The console's HTML, rendered on the server from the ``/api/`` dictionaries.

Each page works without JavaScript (forms post to ``/api/...`` and are redirected
back); ``static/console.js`` adds the live parts: it refreshes numbers and tables
from the same API every two seconds, sorts and filters the destinations table,
draws the rate chart and submits forms with ``fetch``. Every value is escaped; the
pages carry no inline script or style (the Content-Security-Policy forbids both).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import Any
from urllib.parse import quote

__all__ = ["Page", "connections_page", "login_page", "not_found_page", "overview_page", "destinations_page",
           "queue_page"]

CSP = ("default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
       "connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")


def e(value: object) -> str:
    return escape("" if value is None else str(value), quote=True)


def size(n: object) -> str:
    if not isinstance(n, int | float):
        return "–"
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= factor:
            return f"{n / factor:.1f} {unit}"
    return f"{int(n)} B"


def num(n: object) -> str:
    return "–" if n is None else f"{n:,}" if isinstance(n, int) else e(n)


def duration(seconds: object) -> str:
    if not isinstance(seconds, int | float):
        return "–"
    s = int(seconds)
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    if s < 172800:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def queue_url(name: str) -> str:
    return "/queues/" + quote(name, safe="")


class Page:
    """What every page shares: the node, who is logged in, the CSRF token, a flash message."""

    def __init__(self, node: Mapping[str, Any], *, user: str | None, auth_required: bool, csrf: str,
                 flash: str = "", flash_error: bool = False) -> None:
        self.node = node
        self.user = user
        self.auth_required = auth_required
        self.csrf = csrf
        self.flash = flash
        self.flash_error = flash_error

    def form(self, action: str, button: str, *, next_url: str, fields: Iterable[tuple[str, str]] = (),
             confirm: str = "", css: str = "", extra: str = "") -> str:
        hidden = "".join(f'<input type="hidden" name="{e(k)}" value="{e(v)}">' for k, v in fields)
        conf = f' data-confirm="{e(confirm)}"' if confirm else ""
        return (f'<form class="inline {e(css)}" method="post" action="{e(action)}" data-api{conf}>'
                f'<input type="hidden" name="csrf_token" value="{e(self.csrf)}">'
                f'<input type="hidden" name="_next" value="{e(next_url)}">{hidden}{extra}'
                f'<button type="submit">{e(button)}</button></form>')

    def render(self, title: str, page: str, body: str) -> str:
        n = self.node
        role = str(n.get("role", ""))
        nav = "".join(
            f'<a href="{href}"{" class=current" if key == page else ""}>{label}</a>'
            for key, href, label in (("overview", "/", "Overview"), ("destinations", "/destinations", "Destinations"),
                                     ("connections", "/connections", "Connections"), ("metrics", "/metrics", "Metrics"))
        )
        who = ""
        if self.user:
            who = (f'<span class="user">{e(self.user)} '
                   + self.form("/api/logout", "Log out", next_url="/login", css="logout") + "</span>")
        flash = ""
        if self.flash:
            flash = f'<p id="flash" class="flash{" error" if self.flash_error else ""}" role="status">{e(self.flash)}</p>'
        else:
            flash = '<p id="flash" class="flash hidden" role="status"></p>'
        return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>{e(title)} · amq {e(n.get("name"))}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="csrf-token" content="{e(self.csrf)}">
<link rel="stylesheet" href="/static/console.css">
<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">
<script src="/static/console.js" defer></script>
</head><body data-page="{e(page)}">
<header><a class="brand" href="/">amq broker <b>{e(n.get("name"))}</b></a>
<span id="node-role" class="role role-{e(role)}">{e(role)}</span>
<span class="epoch">epoch <span id="node-epoch">{e(n.get("epoch"))}</span></span>
<span id="node-ready" class="ready {"yes" if n.get("ready") else "no"}"
 title="{e(n.get("ready_reason"))}">{"ready" if n.get("ready") else "not ready"}</span>
<nav>{nav}</nav>{who}</header>
<main>{flash}
{body}
</main>
<footer>amqtransport · JSON API under <a href="/api/overview">/api/</a> ·
<a href="/healthz">/healthz</a> · <a href="/readyz">/readyz</a> · pid {e(n.get("pid"))}</footer>
</body></html>
"""


# ---------------------------------------------------------------------- overview
def _node_card(n: Mapping[str, Any]) -> str:
    name = e(n.get("name") or n.get("address"))
    link = ""
    if n.get("http") and not n.get("self"):
        link = f' <a class="console-link" href="http://{e(n["http"])}/">console</a>'
    lag = ""
    if n.get("lag_records") is not None:
        lag = f"{num(n['lag_records'])} record{'' if n['lag_records'] == 1 else 's'}"
        if n.get("lag_bytes") is not None:
            lag += f" / {size(n['lag_bytes'])}"
    rows = [
        ("role", f'<span class="role role-{e(n.get("role"))}">{e(n.get("role"))}</span>'),
        ("epoch", e(n.get("epoch")) if n.get("reachable") else "–"),
        ("client port", e(n.get("client") or "–")),
        ("peer state", e(n.get("peer_state") or "–")),
        ("replication lag", lag or "–"),
        ("connections", num(n.get("connections"))),
        ("stored messages", num(n.get("messages"))),
    ]
    if n.get("witness"):
        rows.append(("witness", e(n["witness"])))
    body = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    this = ' <span class="this">this node</span>' if n.get("self") else ""
    down = "" if n.get("reachable") else ' <span class="role role-down">unreachable</span>'
    return (f'<section class="card node" data-node="{name}"><h3>{name}{this}{down}{link}</h3>'
            f"<table>{body}</table></section>")


def _gauge(label: str, ident: str, usage: object, limit: object, extra: str = "") -> str:
    if not isinstance(usage, int):
        return ""
    if isinstance(limit, int) and limit > 0:
        pct = 100.0 * usage / limit
        meter = f'<meter id="{ident}-meter" min="0" max="{limit}" high="{int(limit * 0.7)}" value="{usage}"></meter>'
        text = f"{size(usage)} of {size(limit)} ({pct:.1f} %)"
    else:
        meter = f'<meter id="{ident}-meter" min="0" max="1" value="0"></meter>'
        text = f"{size(usage)} (no limit)"
    return (f'<div class="gauge"><span class="label">{e(label)}</span>{meter}'
            f'<span id="{ident}-text">{text}</span>{extra}</div>')


def overview_page(page: Page, nodes: Sequence[Mapping[str, Any]], destinations: Sequence[Mapping[str, Any]]) -> str:
    n = page.node
    banner = ""
    if not n.get("ready"):
        master = next((x for x in nodes if x.get("role") == "master" and not x.get("self")), None)
        hint = ""
        if master is not None and master.get("http"):
            hint = f' The master is <a href="http://{e(master["http"])}/">{e(master.get("name"))}</a>.'
        detail = f" ({e(n.get('detail'))})" if n.get("detail") else ""
        banner = f'<p class="banner">This node serves no clients: {e(n.get("ready_reason"))}{detail}.{hint}</p>'

    mem = n.get("memory") or {}
    store = n.get("store") or {}
    if store.get("journal_failed"):
        banner += (f'<p class="banner" id="store-banner">Store failed: {e(store["journal_failed"])}. This node '
                   "fences: it receipts nothing more from this store.</p>")
    elif store.get("failing"):
        banner += (f'<p class="banner" id="store-banner">Store failing: {e(store["failing"])}. It retries '
                   "with a back-off; every receipted message is still durable.</p>")
    cards = "".join(_node_card(x) for x in nodes)
    flow = ""
    if mem.get("flow_control"):
        flow = f' <span class="warn">flow control for {duration(mem.get("flow_control_seconds"))}</span>'
    gauges = _gauge("memory", "memory", mem.get("usage"), mem.get("limit"), flow)
    gauges += _gauge("store", "store", store.get("size"), store.get("limit"),
                     f' <span class="warn">store full for {duration(store.get("flow_control_seconds"))}</span>'
                     if store.get("flow_control") else "")
    counters = n.get("counters") or {}
    facts = [
        ("connections", f'<span id="stat-connections">{num(n.get("connections"))}</span>'),
        ("messages sent", f'<span id="stat-sent">{num(counters.get("sent"))}</span>'),
        ("dead-lettered", f'<span id="stat-dead-lettered">{num(counters.get("dead_lettered"))}</span>'),
        ("expired", num(counters.get("expired"))),
        ("duplicates dropped", num(counters.get("duplicates"))),
        ("stored messages", f'<span id="stat-messages">{num(store.get("messages"))}</span>'),
        ("fsync p50 / p99", _latency(store.get("fsync_p50"), store.get("fsync_p99"))),
        ("takeovers", num(n.get("takeovers"))),
        ("uptime", f'<span id="stat-uptime">{duration(n.get("uptime"))}</span>'),
    ]
    if not n.get("serving"):  # a slave: no clients, no traffic of its own
        facts = [f for f in facts if f[0] in ("stored messages", "fsync p50 / p99", "takeovers", "uptime")]
    fact_rows = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in facts)
    queues = sorted((d for d in destinations if d.get("kind") != "topic"), key=lambda d: -int(d.get("depth", 0)))
    empty = "no queues yet"
    if not n.get("serving"):  # a slave lists no queues of its own: say what it holds
        empty = (f"this node is {e(n.get('role'))}: it holds {num(store.get('messages'))} stored messages "
                 "(a copy of the master's); the master's console lists the queues")
    top = "".join(
        f'<tr data-name="{e(d["name"])}"><td><a href="{queue_url(d["name"])}">{e(d["name"])}</a></td>'
        f'<td class="num depth">{num(d.get("depth"))}</td><td class="num">{num(d.get("consumers"))}</td></tr>'
        for d in queues[:10]
    ) or f'<tr><td colspan="3" class="empty">{empty}</td></tr>'
    return page.render("Overview", "overview", f"""{banner}
<h2>Nodes</h2>
<div class="cards" id="nodes">{cards}</div>
<div class="columns">
<section class="card"><h2>Gauges</h2>{gauges or '<p class="empty">no store open on this node</p>'}
<h2>Message rates</h2>
<canvas id="rate-chart" width="560" height="160" aria-label="messages per second, in and out"></canvas>
<p class="legend"><span class="in">in <b id="rate-in">–</b>/s</span>
<span class="out">out <b id="rate-out">–</b>/s</span></p></section>
<section class="card"><h2>This node</h2><table class="facts">{fact_rows}</table>
<h2>Deepest queues</h2><table class="grid" id="top-queues"><thead><tr><th>queue</th><th>depth</th>
<th>consumers</th></tr></thead><tbody>{top}</tbody></table>
<p><a href="/destinations">all destinations →</a></p></section>
</div>""")


def _latency(p50: object, p99: object) -> str:
    def ms(v: object) -> str:
        return f"≤ {float(v) * 1000:g} ms" if isinstance(v, int | float) else "–"

    return f"{ms(p50)} / {ms(p99)}"


# ---------------------------------------------------------------------- destinations
COLUMNS = (("name", "name"), ("kind", "kind"), ("depth", "depth"), ("consumers", "consumers"),
           ("rate_in", "in/s"), ("rate_out", "out/s"), ("in_flight", "in flight"), ("enqueued", "enqueued"),
           ("dequeued", "dequeued"), ("dlq_depth", "DLQ depth"), ("expired", "expired"))


def destination_row(d: Mapping[str, Any]) -> str:
    name = e(d["name"])
    link = f'<a href="{queue_url(d["name"])}">{name}</a>' if d.get("kind") != "topic" else name
    if d.get("is_dlq"):
        link += ' <span class="tag">DLQ</span>'
    cells = [f"<td>{link}</td>", f'<td>{e(d.get("kind"))}</td>']
    for key, _label in COLUMNS[2:]:
        value = d.get(key)
        cells.append(f'<td class="num {key}">{"–" if key.startswith("rate") else num(value)}</td>')
    return f'<tr data-name="{name}" data-kind="{e(d.get("kind"))}">{"".join(cells)}</tr>'


def destinations_page(page: Page, destinations: Sequence[Mapping[str, Any]], replica: list[tuple[str, int]]) -> str:
    head = "".join(f'<th data-sort="{k}" tabindex="0">{label}</th>' for k, label in COLUMNS)
    rows = "".join(destination_row(d) for d in destinations)
    empty = "" if destinations else '<p class="empty">No destinations on this node.</p>'
    rep = ""
    if replica:
        rep_rows = "".join(f"<tr><td>{e(k)}</td><td class=num>{num(v)}</td></tr>" for k, v in replica)
        rep = (f'<h2>Replica</h2><p>Persistent messages per destination in this node\'s copy of the '
               f'master\'s store.</p><table class="grid"><thead><tr><th>destination</th><th>messages</th>'
               f'</tr></thead><tbody>{rep_rows}</tbody></table>')
    return page.render("Destinations", "destinations", f"""<h2>Destinations</h2>
<div class="toolbar"><input id="filter" type="search" placeholder="filter by name" aria-label="filter by name">
<select id="kind-filter" aria-label="kind"><option value="">all kinds</option><option>queue</option>
<option>topic</option><option>durable</option></select>
<span class="hint">click a column to sort · refreshes every 2 s</span></div>
<table class="grid sortable" id="destinations"><thead><tr>{head}</tr></thead>
<tbody>{rows}</tbody></table>{empty}{rep}""")


# ---------------------------------------------------------------------- queue page
def _message_row(page: Page, q: str, m: Mapping[str, Any], dlq: bool, next_url: str) -> str:
    headers = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in m.get("headers", []))
    original = next((v for k, v in m.get("headers", []) if k == "original-destination"), "")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(m.get("timestamp") or 0)))
    body = e(m.get("body"))
    note = " <span class=tag>binary</span>" if m.get("binary") else ""
    if m.get("truncated"):
        note += f' <span class="tag">first 1 KiB of {size(m.get("size"))}</span>'
    base = f"/api/queues/{quote(q, safe='')}"
    mid = str(m["id"])
    actions = ""
    if dlq or original:
        actions += page.form(f"{base}/retry", "Retry", next_url=next_url, fields=[("ids", mid)], css="retry")
    actions += page.form(f"{base}/move", "Move", next_url=next_url, fields=[("ids", mid)], css="move",
                         extra='<input name="to" placeholder="queue" required aria-label="target queue">')
    actions += page.form(f"{base}/messages/{quote(mid, safe='')}/delete", "Delete", next_url=next_url,
                         confirm=f"Delete message {mid}?", css="danger")
    origin = f'<br><span class="origin">from {e(original)}</span>' if original else ""
    return (f'<tr class="message" data-id="{e(mid)}"><td class="mono">{e(mid)}{origin}</td><td>{e(when)}</td>'
            f'<td class="num">{e(m.get("delivery_count"))}</td><td class="num">{size(m.get("size"))}</td>'
            f"<td><details><summary>{len(m.get('headers', []))} headers</summary><table class=headers>{headers}"
            f'</table></details><pre class="body">{body}</pre>{note}</td><td class="actions">{actions}</td></tr>')


def queue_page(page: Page, d: Mapping[str, Any], browse: Mapping[str, Any], limit: int) -> str:
    q = str(d["name"])
    url = queue_url(q)
    base = f"/api/queues/{quote(q, safe='')}"
    dlq = bool(d.get("is_dlq"))
    stats = [("depth", d.get("depth")), ("consumers", d.get("consumers")), ("in flight", d.get("in_flight")),
             ("enqueued", d.get("enqueued")), ("dequeued", d.get("dequeued")), ("expired", d.get("expired")),
             ("memory", size(d.get("memory")))]
    cells = "".join(f'<div class="stat"><span class="label">{k}</span><b id="q-{k.replace(" ", "-")}">'
                    f"{num(v) if not isinstance(v, str) else v}</b></div>" for k, v in stats)
    dlq_link = ""
    if d.get("dlq") and not dlq:
        dlq_link = (f'<p>Dead-letter queue: <a href="{queue_url(str(d["dlq"]))}">{e(d["dlq"])}</a> '
                    f'(<span id="q-dlq-depth">{num(d.get("dlq_depth"))}</span> messages)</p>')
    total = int(browse.get("total", 0))
    bulk = page.form(f"{base}/purge", "Purge", next_url=url, confirm=f"Remove all {total} waiting messages "
                     f"of {q}?", css="danger")
    if dlq:
        bulk += page.form(f"{base}/retry", "Retry all", next_url=url, fields=[("all", "true")], css="retry-all",
                          confirm=f"Move all {total} messages back to their original destination?")
    bulk += page.form(f"{base}/move", "Move all", next_url=url, fields=[("all", "true")], css="move-all",
                      extra='<input name="to" placeholder="target queue" required aria-label="target queue">')
    offset = int(browse.get("offset", 0))
    rows = "".join(_message_row(page, q, m, dlq, url) for m in browse.get("messages", []))
    shown = len(browse.get("messages", []))
    pager = []
    if offset > 0:
        pager.append(f'<a href="{url}?offset={max(0, offset - limit)}">← previous</a>')
    if offset + shown < total:
        pager.append(f'<a href="{url}?offset={offset + shown}">next →</a>')
    in_flight = int(browse.get("in_flight", 0))
    listing = (f'<p>Messages {offset + 1}–{offset + shown} of <b id="browse-total">{total}</b> waiting'
               + (f", {in_flight} in flight to consumers (not listed)" if in_flight else "") + ". "
               + " · ".join(pager) + "</p>") if total else '<p class="empty" id="browse-total">No messages waiting.</p>'
    send_dest = "/queue/" + q if not q.startswith(("/", "durable:")) else q
    send = f"""<form class="send" method="post" action="/api/send" data-api>
<input type="hidden" name="csrf_token" value="{e(page.csrf)}"><input type="hidden" name="_next" value="{e(url)}">
<label>destination <input name="destination" value="{e(send_dest)}" required></label>
<label>body <textarea name="body" rows="3">hello from the console</textarea></label>
<label><span>headers (one <code>name: value</code> a line)</span><textarea name="headers" rows="2"></textarea></label>
<label class="check"><input type="checkbox" name="persistent" value="true" checked> persistent</label>
<button type="submit">Send</button></form>"""
    title = f"Queue {q}"
    return page.render(title, "queue", f"""<h2>{e(title)}{' <span class="tag">DLQ</span>' if dlq else ''}</h2>
<div class="stats" data-queue="{e(q)}">{cells}</div>{dlq_link}
<div class="columns"><section class="card"><h3>Send a test message</h3>{send}</section>
<section class="card"><h3>All waiting messages</h3><div class="bulk">{bulk}</div>
<p class="hint">Purge removes every waiting message; {"Retry all puts each one back on the queue named in its <code>original-destination</code> header; " if dlq else ""}Move all puts them on the queue you name. Messages in a consumer's hands stay where they are.</p></section></div>
<h3>Browse</h3>{listing}
<table class="grid messages" id="messages"><thead><tr><th>id</th><th>accepted</th><th>deliveries</th><th>size</th>
<th>headers and body</th><th>actions</th></tr></thead><tbody>{rows}</tbody></table>""")


# ---------------------------------------------------------------------- connections
def connections_page(page: Page, conns: Sequence[Mapping[str, Any]], serving: bool) -> str:
    rows = []
    for c in conns:
        close = page.form(f"/api/connections/{quote(str(c['id']), safe='')}/close", "Close", next_url="/connections",
                          confirm=f"Close connection {c['id']} from {c['peer']}?", css="danger")
        subs = "<br>".join(e(s) for s in c.get("subscriptions", [])) or "–"
        rows.append(f'<tr data-id="{e(c["id"])}"><td class="mono">{e(c["id"])}</td><td>{e(c["peer"])}</td>'
                    f'<td>{e(c.get("user") or "–")}</td><td>{e(c.get("client_id") or "–")}</td>'
                    f'<td>{e(c.get("transport") or "tcp")}</td>'
                    f'<td>{e(c.get("version"))}</td><td>{duration(c.get("age"))}</td><td>{subs}</td>'
                    f'<td class="num">{num(c.get("unacked"))}</td><td class="num">{num(c.get("frames_in"))}</td>'
                    f'<td class="num">{num(c.get("messages_out"))}</td><td>{close}</td></tr>')
    if not serving:
        body = '<p class="empty">This node serves no clients, so it has no connections.</p>'
    elif not rows:
        body = '<p class="empty">No client connections.</p>'
    else:
        body = ('<table class="grid" id="connections"><thead><tr><th>id</th><th>peer</th><th>user</th>'
                "<th>client-id</th><th>transport</th><th>STOMP</th><th>open for</th><th>subscriptions</th><th>unacked</th>"
                f"<th>frames in</th><th>messages out</th><th></th></tr></thead><tbody>{''.join(rows)}</tbody></table>")
    return page.render("Connections", "connections", f"<h2>Connections</h2>{body}")


# ---------------------------------------------------------------------- login, errors
def login_page(page: Page, next_url: str, error: str = "") -> str:
    err = f'<p class="flash error">{e(error)}</p>' if error else ""
    return page.render("Log in", "login", f"""<h2>Log in</h2>{err}
<p>Use a user of this broker's users file.</p>
<form class="login" method="post" action="/api/login">
<input type="hidden" name="csrf_token" value="{e(page.csrf)}"><input type="hidden" name="_next" value="{e(next_url)}">
<label>user <input name="user" autocomplete="username" required autofocus></label>
<label>password <input name="password" type="password" autocomplete="current-password" required></label>
<button type="submit">Log in</button></form>""")


def not_found_page(page: Page, what: str) -> str:
    return page.render("Not found", "error", f'<h2>Not found</h2><p>{e(what)}</p><p><a href="/">overview</a></p>')
