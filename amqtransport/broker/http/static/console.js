// amq broker console: live refresh from the JSON API, sortable/filterable tables,
// the rate chart, and form submission with the CSRF token. No build step, no library.
"use strict";
(function () {
  const REFRESH_MS = 2000;
  const csrf = (document.querySelector('meta[name="csrf-token"]') || {}).content || "";
  const page = document.body.dataset.page;
  const $ = (sel, root) => (root || document).querySelector(sel);
  const $$ = (sel, root) => Array.from((root || document).querySelectorAll(sel));

  function esc(v) {
    return String(v === null || v === undefined ? "" : v).replace(/[&<>"']/g,
      (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  }
  function num(v) { return v === null || v === undefined ? "–" : Number(v).toLocaleString("en-US"); }
  function size(n) {
    if (typeof n !== "number") return "–";
    const units = [["GiB", 1 << 30], ["MiB", 1 << 20], ["KiB", 1 << 10]];
    for (const [u, f] of units) if (n >= f) return (n / f).toFixed(1) + " " + u;
    return n + " B";
  }
  function rate(v) { return v === null || v === undefined ? "–" : v < 10 ? v.toFixed(1) : Math.round(v).toString(); }
  function duration(s) {
    s = Math.floor(s || 0);
    if (s < 120) return s + " s";
    if (s < 7200) return Math.floor(s / 60) + " min";
    if (s < 172800) return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
    return Math.floor(s / 86400) + " d " + Math.floor((s % 86400) / 3600) + " h";
  }
  function queueUrl(name) { return "/queues/" + encodeURIComponent(name); }

  // ------------------------------------------------------------ flash messages
  function flash(text, isError) {
    const el = $("#flash");
    if (!el) return;
    el.textContent = text;
    el.classList.remove("hidden");
    el.classList.toggle("error", !!isError);
  }
  const pending = sessionStorage.getItem("amq-flash");
  if (pending) {
    sessionStorage.removeItem("amq-flash");
    const f = JSON.parse(pending);
    flash(f.text, f.error);
  }

  // ------------------------------------------------------------ actions (forms)
  document.addEventListener("submit", async (ev) => {
    const form = ev.target;
    if (!(form instanceof HTMLFormElement) || !form.hasAttribute("data-api")) return;
    ev.preventDefault();
    if (form.dataset.confirm && !window.confirm(form.dataset.confirm)) return;
    const body = new URLSearchParams(new FormData(form));
    const button = $("button", form);
    if (button) button.disabled = true;
    try {
      const resp = await fetch(form.action, {
        method: "POST", body, credentials: "same-origin",
        headers: { "X-CSRF-Token": csrf, "X-Requested-With": "amq-console", "Accept": "application/json" },
      });
      let data = {};
      try { data = await resp.json(); } catch (e) { data = { error: resp.status + " " + resp.statusText }; }
      if (resp.status === 401) { window.location = "/login?next=" + encodeURIComponent(location.pathname); return; }
      const text = data.message || data.error || resp.statusText;
      sessionStorage.setItem("amq-flash", JSON.stringify({ text, error: !resp.ok }));
      const next = (form.querySelector('input[name="_next"]') || {}).value;
      if (resp.ok && next && next !== location.pathname) window.location = next; else window.location.reload();
    } catch (e) {
      flash("request failed: " + e, true);
      if (button) button.disabled = false;
    }
  });

  async function getJSON(url) {
    const resp = await fetch(url, { credentials: "same-origin", headers: { "X-Requested-With": "amq-console" } });
    if (resp.status === 401) { window.location = "/login?next=" + encodeURIComponent(location.pathname); return null; }
    if (!resp.ok) throw new Error(url + ": " + resp.status);
    return resp.json();
  }

  function updateHeader(node) {
    const role = $("#node-role");
    if (role) { role.textContent = node.role; role.className = "role role-" + node.role; }
    const epoch = $("#node-epoch");
    if (epoch) epoch.textContent = node.epoch;
    const ready = $("#node-ready");
    if (ready) {
      ready.textContent = node.ready ? "ready" : "not ready";
      ready.className = "ready " + (node.ready ? "yes" : "no");
      ready.title = node.ready_reason;
    }
  }

  // ------------------------------------------------------------ overview
  const samples = [];
  let lastTotals = null;

  function drawChart() {
    const canvas = $("#rate-chart");
    if (!canvas) return;
    const ratio = window.devicePixelRatio || 1;
    const w = canvas.clientWidth || 560, h = canvas.clientHeight || 160;
    canvas.width = w * ratio; canvas.height = h * ratio;
    const ctx = canvas.getContext("2d");
    ctx.scale(ratio, ratio);
    ctx.clearRect(0, 0, w, h);
    const max = Math.max(1, ...samples.map((s) => Math.max(s.in, s.out)));
    const pad = 28, n = 60;
    ctx.strokeStyle = "#d0d7de"; ctx.fillStyle = "#57606a"; ctx.font = "11px sans-serif"; ctx.lineWidth = 1;
    for (const frac of [0, 0.5, 1]) {
      const y = h - 14 - frac * (h - 24);
      ctx.beginPath(); ctx.moveTo(pad, y); ctx.lineTo(w - 4, y); ctx.stroke();
      ctx.fillText(rate(max * frac), 2, y + 4);
    }
    ctx.fillText("last 2 min", w - 64, h - 2);
    for (const [key, color] of [["in", "#0969da"], ["out", "#1a7f37"]]) {
      ctx.strokeStyle = color; ctx.lineWidth = 2; ctx.setLineDash(key === "out" ? [6, 4] : []); ctx.beginPath();
      samples.forEach((s, i) => {
        const x = pad + (w - pad - 4) * (i + n - samples.length) / (n - 1);
        const y = h - 14 - (s[key] / max) * (h - 24);
        if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
      });
      ctx.stroke();
    }
  }

  function nodeCard(n) {
    const lag = n.lag_records === null || n.lag_records === undefined ? "–"
      : num(n.lag_records) + (n.lag_records === 1 ? " record" : " records") + (n.lag_bytes === null || n.lag_bytes === undefined ? "" : " / " + size(n.lag_bytes));
    const rows = [
      ["role", '<span class="role role-' + esc(n.role) + '">' + esc(n.role) + "</span>"],
      ["epoch", n.reachable ? esc(n.epoch) : "–"], ["client port", esc(n.client || "–")], ["peer state", esc(n.peer_state || "–")],
      ["replication lag", lag], ["connections", num(n.connections)], ["stored messages", num(n.messages)],
    ].concat(n.witness ? [["witness", esc(n.witness)]] : []).map(([k, v]) => "<tr><th>" + k + "</th><td>" + v + "</td></tr>").join("");
    const name = esc(n.name || n.address);
    const link = n.http && !n.self ? ' <a class="console-link" href="http://' + esc(n.http) + '/">console</a>' : "";
    return '<section class="card node" data-node="' + name + '"><h3>' + name +
      (n.self ? ' <span class="this">this node</span>' : "") +
      (n.reachable ? "" : ' <span class="role role-down">unreachable</span>') + link +
      "</h3><table>" + rows + "</table></section>";
  }

  function gauge(id, usage, limit) {
    const meter = $("#" + id + "-meter"), text = $("#" + id + "-text");
    if (!meter || typeof usage !== "number") return;
    if (limit > 0) {
      meter.max = limit; meter.value = usage; meter.high = limit * 0.7;
      text.textContent = size(usage) + " of " + size(limit) + " (" + (100 * usage / limit).toFixed(1) + " %)";
    } else { text.textContent = size(usage) + " (no limit)"; }
  }

  async function refreshOverview() {
    const data = await getJSON("/api/overview");
    if (!data) return;
    const node = data.node;
    updateHeader(node);
    const nodes = $("#nodes");
    if (nodes) nodes.innerHTML = data.nodes.map(nodeCard).join("");
    gauge("memory", node.memory && node.memory.usage, node.memory && node.memory.limit);
    gauge("store", node.store && node.store.size, node.store && node.store.limit);
    const set = (id, v) => { const el = $("#" + id); if (el) el.textContent = num(v); };
    set("stat-connections", node.connections);
    set("stat-sent", node.counters.sent);
    set("stat-dead-lettered", node.counters.dead_lettered);
    const up = $("#stat-uptime");
    if (up) up.textContent = duration(node.uptime);
    if (node.store) set("stat-messages", node.store.messages);
    const t = data.totals, now = data.time;
    if (lastTotals) {
      const dt = Math.max(0.001, now - lastTotals.time);
      const sIn = Math.max(0, t.enqueued - lastTotals.enqueued) / dt;
      const sOut = Math.max(0, t.dequeued - lastTotals.dequeued) / dt;
      samples.push({ in: sIn, out: sOut });
      if (samples.length > 60) samples.shift();
      $("#rate-in").textContent = rate(sIn);
      $("#rate-out").textContent = rate(sOut);
    }
    lastTotals = Object.assign({ time: now }, t);
    drawChart();
  }

  // ------------------------------------------------------------ destinations
  let sortKey = "name", sortDir = 1, rows = [];
  const previous = {};

  function destRow(d) {
    let name = esc(d.name);
    if (d.kind !== "topic") name = '<a href="' + queueUrl(d.name) + '">' + name + "</a>";
    if (d.is_dlq) name += ' <span class="tag">DLQ</span>';
    const cols = ["depth", "consumers", "rate_in", "rate_out", "in_flight", "enqueued", "dequeued", "dlq_depth", "expired"];
    return '<tr data-name="' + esc(d.name) + '" data-kind="' + esc(d.kind) + '"><td>' + name + "</td><td>" +
      esc(d.kind) + "</td>" + cols.map((c) => '<td class="num ' + c + '">' +
        (c.startsWith("rate") ? rate(d[c]) : num(d[c])) + "</td>").join("") + "</tr>";
  }

  function renderDestinations() {
    const body = $("#destinations tbody");
    if (!body) return;
    const needle = ($("#filter") || { value: "" }).value.toLowerCase();
    const kind = ($("#kind-filter") || { value: "" }).value;
    const shown = rows.filter((d) => d.name.toLowerCase().includes(needle) && (!kind || d.kind === kind));
    shown.sort((a, b) => {
      const x = a[sortKey], y = b[sortKey];
      if (typeof x === "number" || typeof y === "number") return sortDir * ((x || 0) - (y || 0));
      return sortDir * String(x).localeCompare(String(y));
    });
    body.innerHTML = shown.map(destRow).join("");
    $$("#destinations th[data-sort]").forEach((th) => {
      th.classList.toggle("sorted", th.dataset.sort === sortKey);
      th.classList.toggle("desc", th.dataset.sort === sortKey && sortDir < 0);
    });
  }

  async function refreshDestinations() {
    const data = await getJSON("/api/destinations");
    if (!data) return;
    const now = data.time;
    rows = data.destinations.map((d) => {
      const key = d.kind + " " + d.name, p = previous[key];
      const out = Object.assign({}, d);
      if (p && now > p.time) {
        out.rate_in = Math.max(0, d.enqueued - p.enqueued) / (now - p.time);
        out.rate_out = Math.max(0, d.dequeued - p.dequeued) / (now - p.time);
      } else { out.rate_in = null; out.rate_out = null; }
      previous[key] = { enqueued: d.enqueued, dequeued: d.dequeued, time: now };
      return out;
    });
    renderDestinations();
  }

  function setupDestinations() {
    $$("#destinations th[data-sort]").forEach((th) => {
      const sort = () => {
        if (sortKey === th.dataset.sort) sortDir = -sortDir;
        else { sortKey = th.dataset.sort; sortDir = ["name", "kind"].includes(sortKey) ? 1 : -1; }
        renderDestinations();
      };
      th.addEventListener("click", sort);
      th.addEventListener("keydown", (ev) => { if (ev.key === "Enter") sort(); });
    });
    const f = $("#filter"), k = $("#kind-filter");
    if (f) f.addEventListener("input", renderDestinations);
    if (k) k.addEventListener("change", renderDestinations);
  }

  // ------------------------------------------------------------ queue page
  async function refreshQueue() {
    const holder = $(".stats[data-queue]");
    if (!holder) return;
    const d = await getJSON("/api/queues/" + encodeURIComponent(holder.dataset.queue));
    if (!d) return;
    for (const [id, key] of [["q-depth", "depth"], ["q-consumers", "consumers"], ["q-in-flight", "in_flight"],
      ["q-enqueued", "enqueued"], ["q-dequeued", "dequeued"], ["q-expired", "expired"], ["q-dlq-depth", "dlq_depth"]]) {
      const el = $("#" + id);
      if (el) el.textContent = num(d[key]);
    }
  }

  // ------------------------------------------------------------ the loop
  const refreshers = { overview: refreshOverview, destinations: refreshDestinations, queue: refreshQueue };
  const refresh = refreshers[page];
  if (page === "destinations") setupDestinations();
  if (refresh) {
    const tick = async () => {
      try { await refresh(); } catch (e) { /* the node may be restarting: try again */ }
      setTimeout(tick, REFRESH_MS);
    };
    tick();
  }
  if (page === "overview") window.addEventListener("resize", drawChart);
})();
