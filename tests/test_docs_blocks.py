"""Every docs block that is meant to be run runs: README.md and docs/*.md, as a reader would.

For each page, its fenced ``sh``/``bash``/``shell``/``console`` and ``python`` blocks run
in page order in one scratch directory (``examples/`` and ``.venv`` linked in, the
repository first on ``PYTHONPATH``), so a later block sees what an earlier one started
or wrote. A block that fails (a non-zero exit, a timeout) fails the page's test with
the block's line, the rewritten script and its output.

What runs:

- ``sh``/``bash``/``shell``: the whole block as one ``bash`` script with ``set -e``;
  a line ending in ``&`` runs in the background and the block (or its ``wait`` line)
  waits for it (its exit status counts); the answer to every prompt is ``y``.
- ``console``: each ``$ command`` line; it must fail when the output shown under it
  has an ``error:`` line, else succeed.
- ``python``: the block as a script (``sys.executable``).
- other blocks (``text``, ``toml``, ``yaml``, output) do not run.

Markers (an HTML comment on the last non-blank line before the fence):

- ``<!-- not-run: REASON -->``: the block does not run (a reason is required);
- ``<!-- file: NAME -->``: the block's text is written to NAME in the scratch directory
  (e.g. the ``bridge.toml`` a later command reads);
- ``<!-- run: alone -->``: the block runs in its own scratch directory, with its own
  ports, and what it started is stopped at its end (a second setup of the same
  brokers on a page whose first setup still runs).

The rewrite table (applied to each block before it runs; :data:`REWRITES`):

- every port the docs use (:data:`DOC_PORTS`) becomes a free port, the same one for
  the whole page (``alone`` blocks get their own);
- ``amq broker pair`` without ``--port`` gets ``--port 61613 --slave-port 61614``
  (its defaults, then rewritten as above); ``amq chaos proxy`` without ``--port`` gets
  ``--port 8474``;
- a message count above :data:`MAX_COUNT` (``--count``/``-n``/``--expect``) becomes
  :data:`MAX_COUNT`, ``--rounds N`` becomes ``--rounds 1``;
- ``<master pid ...>`` and the sample pid ``4242`` become the pid of the node that is
  master now, ``<slave pid ...>`` the slave's (asked on the page's ports);
- a long-running command (:data:`DAEMONS`: ``amq broker pair``, ``amq broker run``,
  ``amq broker witness``, ``amq chaos proxy``, ``amq bridge run``) not sent to the background by the page
  runs in the background (own session) until its ready line (:data:`READY`); it is
  stopped by pid (SIGTERM, then SIGKILL) when the page (or ``alone`` block) ends.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from amqtransport.testing.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: ports written in the docs; each becomes a free port per page
DOC_PORTS = (61613, 61614, 61623, 61624, 61633, 61643, 61700, 61701, 61702, 8161, 8162, 8474, 36613)
MAX_COUNT = 2000
DAEMONS = ("amq broker pair", "amq broker run", "amq broker witness", "amq chaos proxy", "amq bridge run")
#: a line of a daemon's output that says it is ready (grep -E, per line). Anchored where
#: ``amq broker pair`` relays a node's own line ("node a (pid N): listening on ..."): the
#: pair is ready at its own "Ctrl-C stops both nodes.", once both nodes have their roles
READY = r"^Ctrl-C stops|^listening on stomp://|^ha node |API on http|bridge .* up|status on http|^witness listening on"
BLOCK_TIMEOUT = 150.0
SHELL_KINDS = ("sh", "bash", "shell")
MARKER = re.compile(r"^\s*<!--\s*(not-run|file|run)\s*:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")

REWRITES: list[tuple[str, str]] = [
    (r"<master pid[^>]*>", "$(_pid master)"),
    (r"<slave pid[^>]*>", "$(_pid slave)"),
    (r"\bkill -9 4242\b", "kill -9 $(_pid master)"),
    (r"--rounds \d+", "--rounds 1"),
]


@dataclass
class Block:
    line: int  # of the opening fence, 1-based
    kind: str
    text: str
    marker: tuple[str, str] | None = None


@dataclass
class Session:
    """A scratch directory, its ports and the background processes started there."""

    root: Path
    ports: dict[int, int] = field(default_factory=dict)
    daemons: list[int] = field(default_factory=list)


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a page, with the marker before each (if any)."""
    out: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, kind = m.group(1), m.group(2), m.group(3).lower()
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            line = lines[j]
            body.append(line[len(indent):] if line.startswith(indent) else line.lstrip())
            j += 1
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        marker = None
        if k >= 0 and lines[k].strip().startswith("<!--"):
            mm = MARKER.match(lines[k])
            if mm is None or not mm.group(2):
                raise ValueError(f"{path.name}:{k + 1}: a docs marker is <!-- not-run: REASON -->, "
                                 f"<!-- file: NAME --> or <!-- run: alone -->, got {lines[k].strip()!r}")
            marker = (mm.group(1), mm.group(2))
            if marker[0] == "run" and marker[1] != "alone":
                raise ValueError(f"{path.name}:{k + 1}: unknown run marker {marker[1]!r} (only 'alone')")
        out.append(Block(i + 1, kind, "\n".join(body) + "\n", marker))
        i = j + 1
    return out


def runs(block: Block) -> bool:
    if block.marker is not None and block.marker[0] in ("not-run", "file"):
        return False
    return block.kind in (*SHELL_KINDS, "console", "python")


def rewrite(text: str, session: Session) -> str:
    """The rewrite table (module docstring) applied to one block."""
    def count(m: re.Match[str]) -> str:
        n = int(m.group(2).replace("_", ""))
        return f"{m.group(1)}{min(n, MAX_COUNT)}"

    text = re.sub(r"(--count |-n |--expect )(\d[\d_]*)", count, text)
    text = re.sub(r"(amq broker pair)(?![^\n#]*--port)", r"\1 --port 61613 --slave-port 61614", text)
    text = re.sub(r"(amq chaos proxy)(?![^\n#]*--port)", r"\1 --port 8474", text)
    for pattern, repl in REWRITES:
        text = re.sub(pattern, repl, text)
    for port in DOC_PORTS:
        if port not in session.ports:
            session.ports[port] = free_port()
    return re.sub(r"(?<!\d)(" + "|".join(map(str, DOC_PORTS)) + r")(?!\d)",
                  lambda m: str(session.ports[int(m.group(1))]), text)


def shell_script(text: str) -> str:
    """A shell block as a bash script: daemons to the background, background jobs
    waited for, ``set -e``."""
    logical: list[str] = []
    for line in text.splitlines():
        if logical and logical[-1].endswith("\\"):
            logical[-1] = logical[-1][:-1] + " " + line.strip()
        else:
            logical.append(line)
    out = []
    for line in logical:
        m = re.match(r"^(.*?)(\s+#\s.*)?$", line)
        assert m is not None
        code = m.group(1).strip()
        if code.endswith("&") and not code.endswith("&&"):
            out.append(f"{code} _bg+=($!)")
        elif code == "wait":
            out.append(f"_wait{m.group(2) or ''}")
        elif code.startswith(DAEMONS):
            out.append(f"_daemon {code}")
        else:
            out.append(line)
    return "\n".join([PRELUDE, *out, "_wait", ""])


PRELUDE = r"""set -e -o pipefail
_bg=()
_wait() { local p; for p in "${_bg[@]}"; do wait "$p"; done; _bg=(); }   # each job's exit status counts
_daemon() {  # run "$@" in the background, in its own session, until its ready line
  local log; log=".docs-run/daemon-$RANDOM$RANDOM.log"
  setsid "$@" >"$log" 2>&1 </dev/null &
  local pid=$! t=0
  echo "$pid" >> .docs-run/daemons
  until grep -qE "$DOCS_READY" "$log"; do
    if ! kill -0 "$pid" 2>/dev/null; then echo "daemon exited: $*" >&2; cat "$log" >&2; return 1; fi
    t=$((t+1)); if [ "$t" -gt 1200 ]; then echo "daemon not ready in 120 s: $*" >&2; cat "$log" >&2; return 1; fi
    sleep 0.1
  done
  cat "$log"
}
_pid() { python .docs-run/pid.py "$1"; }   # the pid of the node in that role now
"""

#: the pid of the node that has a role: asks the page's client ports (a master answers
#: there) and the HA ports of every pair started in the scratch directory (pair.json)
HELPER = """import json, os, sys
from pathlib import Path
from amqtransport.broker.ha.wire import ha_request_sync
role = sys.argv[1]
ports = [int(p) for p in os.environ["DOCS_PORTS"].split()]
for pj in Path(".").rglob("pair.json"):
    ports += [n["ha_port"] for n in json.loads(pj.read_text())["nodes"].values()]
for port in ports:
    try:
        h = dict(ha_request_sync("127.0.0.1", port, 1.0).headers)
    except Exception:
        continue
    if h.get("amq-ha-role") == role:
        print(h["amq-ha-pid"])
        sys.exit(0)
sys.exit(f"no {role} answers on ports {ports}")
"""


def _env(session: Session) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["DOCS_READY"] = READY
    env["DOCS_PORTS"] = " ".join(str(p) for p in session.ports.values())
    return env


def _scratch(root: Path) -> Session:
    root.mkdir(parents=True)
    (root / ".docs-run").mkdir()
    (root / "examples").symlink_to(ROOT / "examples")
    (root / ".venv").symlink_to(Path(sys.prefix))
    (root / ".docs-run" / "pid.py").write_text(HELPER)
    return Session(root)


def _run(cmd: list[str], session: Session, what: str, input_text: str = "y\n" * 20,
         expect_fail: bool = False) -> str:
    env = _env(session)
    try:
        done = subprocess.run(cmd, cwd=session.root, env=env, input=input_text, capture_output=True, text=True,
                              timeout=BLOCK_TIMEOUT, start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{what}: no end within {BLOCK_TIMEOUT} s\n--- stdout\n{exc.stdout!r}\n--- stderr\n{exc.stderr!r}")
    failed = done.returncode != 0
    if failed != expect_fail:
        pytest.fail(f"{what}: exit {done.returncode} (expected {'failure' if expect_fail else 'success'})\n"
                    f"--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}"
                    + _daemon_logs(session))
    return done.stdout


def _daemon_logs(session: Session) -> str:
    out = ""
    for log in sorted((session.root / ".docs-run").glob("daemon-*.log")):
        out += f"\n--- {log.name}\n{log.read_text(errors='replace')[-2000:]}"
    return out


def _stop(session: Session) -> None:
    pids_file = session.root / ".docs-run" / "daemons"
    pids = [int(p) for p in pids_file.read_text().split()] if pids_file.exists() else []
    for pid in reversed(pids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 40
    for pid in pids:
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.1)
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    pids_file.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def run_block(block: Block, session: Session, page: str, index: int) -> None:
    what = f"{page}:{block.line} ({block.kind} block)"
    text = rewrite(block.text, session)
    if block.kind in SHELL_KINDS:
        script = shell_script(text)
        path = session.root / ".docs-run" / f"block-{index}.sh"
        path.write_text(script)
        _run(["bash", str(path)], session, f"{what}\n{script}")
    elif block.kind == "console":
        lines = text.splitlines()
        for n, line in enumerate(lines):
            if not line.startswith("$ "):
                continue
            shown = []
            for rest in lines[n + 1:]:
                if rest.startswith("$ "):
                    break
                shown.append(rest)
            fails = any(s.startswith("error:") for s in shown)
            _run(["bash", "-c", line[2:]], session, f"{what}: {line}", expect_fail=fails)
    else:
        path = session.root / ".docs-run" / f"block-{index}.py"
        path.write_text(text)
        _run([sys.executable, str(path)], session, f"{what}\n{text}")


def _page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_docs_blocks_run(page: Path, tmp_path: Path) -> None:
    found = blocks(page)
    if not any(runs(b) or (b.marker and b.marker[0] == "file") for b in found):
        pytest.skip(f"{page.name}: no block to run")
    session = _scratch(tmp_path / "page")
    name = _page_id(page)
    try:
        for index, block in enumerate(found):
            if block.marker is not None and block.marker[0] == "file":
                (session.root / block.marker[1]).write_text(rewrite(block.text, session))
                continue
            if not runs(block):
                continue
            if block.marker == ("run", "alone"):
                alone = _scratch(tmp_path / f"alone-{index}")
                try:
                    run_block(block, alone, name, index)
                finally:
                    _stop(alone)
            else:
                run_block(block, session, name, index)
    finally:
        _stop(session)


def test_markers_are_well_formed_and_not_run_says_why() -> None:
    """Every page parses: each marker is one of the three, a not-run one has a reason."""
    for page in PAGES:
        for block in blocks(page):
            if block.marker is not None and block.marker[0] == "not-run":
                assert len(block.marker[1]) > 5, f"{page.name}:{block.line}: say why the block does not run"


def test_a_pair_is_ready_at_its_own_line_not_at_a_relayed_node_line() -> None:
    """``amq broker pair`` relays its nodes' lines; node a's "listening on" comes before
    node b is a synced slave, and a block that kills the master then had nothing to take
    over (a CI failure of docs/ha.md). Only the pair's own last line says both are up."""
    ready = re.compile(READY)
    relayed = ["node a (pid 4242): listening on stomp://127.0.0.1:61613",
               "node b (pid 4243): ha node b mode replicated ha-port tcp://127.0.0.1:1 pid 4243",
               "node b (pid 4243): Ctrl-C stops it"]
    assert not [line for line in relayed if ready.search(line)]
    for own in ["Ctrl-C stops both nodes.", "listening on stomp://127.0.0.1:61613",
                "ha node a mode replicated ha-port tcp://127.0.0.1:1 pid 1", "witness listening on 127.0.0.1:1"]:
        assert ready.search(own), own


def test_rewrites(tmp_path: Path) -> None:
    session = Session(tmp_path)
    text = rewrite("amq broker pair --mode replicated   # x\namq send -n 100000 u /q &\nkill -9 <master pid>\n", session)
    p1, p2 = session.ports[61613], session.ports[61614]
    assert f"amq broker pair --port {p1} --slave-port {p2} --mode replicated" in text
    assert "-n 2000 " in text and "kill -9 $(_pid master)" in text
    script = shell_script(text)
    assert f"_daemon amq broker pair --port {p1}" in script and "_bg+=($!)" in script
    bad = tmp_path / "bad.md"
    bad.write_text("<!-- not run -->\n```sh\necho\n```\n")
    with pytest.raises(ValueError, match="docs marker"):
        blocks(bad)
