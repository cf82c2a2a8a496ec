"""The documentation stays navigable: README.md is a short front door, docs/ the reference.

Checked for README.md and every page under docs/:

- every relative link (``[text](target)``, ``[text]: target``) names a file or directory
  that exists, and a ``#fragment`` names a heading of the target page (GitHub's
  anchors: lower case, punctuation dropped, spaces to hyphens, ``-1`` for repeats);
- every repository path written in code style (```amqtransport/broker/dispatch/core.py```,
  ```tests/ha```, globs such as ```tests/chaos/test_proxy_*.py```) exists, so a page
  cannot keep naming a module after it moved;
- every test named in code style as ```tests/FILE.py::test_name``` (a promise's proof,
  e.g. in docs/reliability.md) is defined in that file;
- every ``amq`` command line in their code (fenced blocks and inline code) names a real
  command and real options of it (the click tree of ``amqtransport.cli.main``), and
  every ``make TARGET`` is a target of the Makefile; every ```python`` block compiles and
  every ```toml`` block parses (on docs/bridge.md: as a bridge config);
- every key of the broker's config has a row in docs/broker.md's table, and README's
  exception tree names every class of ``amqtransport.errors``;
- README.md is at most 250 lines, and reaches every page under docs/ (directly or
  through the docs index).

The link and path checks skip fenced code blocks: they hold commands and output.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_LINES = 250

# The top-level directories of the repository whose paths the docs write in code style.
REPO_DIRS = ("amqtransport", "bridge", "chaos", "tests", "examples", "benchmarks", "scripts", "docs")

INLINE_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
IMAGE_LINK = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(\S+)", re.MULTILINE)
INLINE_CODE = re.compile(r"`([^`\n]+)`")
REPO_PATH = re.compile(r"^(?:" + "|".join(REPO_DIRS) + r")/[\w./*-]*$")
TEST_REF = re.compile(r"^(tests/[\w./-]+\.py)::(\w+)(?:\[[^\]]*\])?$")


def doc_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def prose(text: str) -> str:
    """The text without fenced code blocks (``` or ~~~), line count kept."""
    out: list[str] = []
    fence: str | None = None
    for line in text.splitlines():
        stripped = line.lstrip()
        if fence is None and (stripped.startswith("```") or stripped.startswith("~~~")):
            fence = stripped[:3]
            out.append("")
        elif fence is not None:
            if stripped.startswith(fence):
                fence = None
            out.append("")
        else:
            out.append(line)
    return "\n".join(out)


def links(text: str) -> list[str]:
    body = prose(text)
    # a link inside inline code is an example, not a link
    body_no_code = INLINE_CODE.sub(lambda m: " " * len(m.group(0)), body)
    found = INLINE_LINK.findall(body_no_code) + IMAGE_LINK.findall(body_no_code)
    found += REFERENCE_DEF.findall(body_no_code)
    return found


def is_external(target: str) -> bool:
    return bool(re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading: its text
    text = text.lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in prose(path.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(path: Path) -> list[str]:
    bad: list[str] = []
    for target in links(path.read_text(encoding="utf-8")):
        if is_external(target):
            continue
        file_part, _, fragment = target.partition("#")
        dest = path if not file_part else (path.parent / file_part)
        if not dest.exists():
            bad.append(f"{target}: {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest} does not exist")
            continue
        if fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            bad.append(f"{target}: no heading with anchor #{fragment} in {dest.name}")
    return bad


def missing_code_paths(path: Path) -> list[str]:
    bad: list[str] = []
    for span in INLINE_CODE.findall(prose(path.read_text(encoding="utf-8"))):
        for token in span.split():
            token = token.rstrip(".,;:)")
            ref = TEST_REF.match(token)
            if ref:
                test_file, name = ROOT / ref.group(1), ref.group(2)
                if not test_file.is_file():
                    bad.append(f"`{token}`: {ref.group(1)} does not exist")
                elif not re.search(rf"^\s*(?:async\s+)?def {name}\(", test_file.read_text(encoding="utf-8"), re.MULTILINE):
                    bad.append(f"`{token}`: no test {name} in {ref.group(1)}")
                continue
            if not REPO_PATH.match(token):
                continue
            if "*" in token:
                if not any(ROOT.glob(token)):
                    bad.append(f"`{token}` matches nothing")
            elif not (ROOT / token).exists():
                bad.append(f"`{token}` does not exist")
    return bad


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    assert broken_links(path) == []


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_code_style_repository_paths_exist(path: Path) -> None:
    assert missing_code_paths(path) == []


def test_readme_is_a_short_front_door() -> None:
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; move reference text into docs/"


def test_readme_keeps_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert "make demo" in text and "make test" in text


def test_every_docs_page_is_reachable_from_the_readme() -> None:
    reached: set[Path] = set()
    todo = [README]
    while todo:
        page = todo.pop()
        if page in reached:
            continue
        reached.add(page)
        for target in links(page.read_text(encoding="utf-8")):
            file_part = target.partition("#")[0]
            if is_external(target) or not file_part.endswith(".md"):
                continue
            dest = (page.parent / file_part).resolve()
            if dest.is_relative_to(DOCS.resolve()) or dest == README:
                todo.append(dest)
    unreached = [str(p.relative_to(ROOT)) for p in sorted(DOCS.rglob("*.md")) if p.resolve() not in reached]
    assert unreached == [], "no link from README.md leads to these pages: link each from docs/README.md or the page of its area"


# The checkers themselves must be able to fail.


def test_checker_finds_broken_links_and_paths(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## `amq send` / `amq recv` twice\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n"
        "[ok](other.md) [ok anchor](other.md#amq-send--amq-recv-twice) [self](#page)\n"
        "[gone](missing.md) [bad anchor](other.md#nope) [web](https://example.org/x)\n"
        "`[not a link](nowhere.md)` `amqtransport/no_such_module.py` `amqtransport/errors.py`\n"
        "`tests/test_docs.py::test_slug_follows_github` `tests/test_docs.py::test_gone[x]`\n"
        "`tests/no_such_test.py::test_x`\n"
        "```\n[in a fence](fenced.md) `amqtransport/fenced.py`\n```\n"
        "[ref]: also-missing.md\n",
        encoding="utf-8",
    )
    bad = broken_links(page)
    assert len(bad) == 3 and any("missing.md" in b for b in bad) and any("#nope" in b for b in bad)
    assert any("also-missing.md" in b for b in bad)
    assert missing_code_paths(page) == [
        "`amqtransport/no_such_module.py` does not exist",
        "`tests/test_docs.py::test_gone[x]`: no test test_gone in tests/test_docs.py",
        "`tests/no_such_test.py::test_x`: tests/no_such_test.py does not exist",
    ]


def test_slug_follows_github() -> None:
    assert slug("Epochs, reintroduction and split brain (beyond ActiveMQ)") == (
        "epochs-reintroduction-and-split-brain-beyond-activemq"
    )
    assert slug("In Python (tests)") == "in-python-tests"
    assert slug("`amq send` / `amq recv` through a master kill") == "amq-send--amq-recv-through-a-master-kill"


# Every `amq ...` command line the docs show names a real command and real options.

AMQ_CALL = re.compile(r"(?:^|(?<=[\s(`$'\"]))(?:\S*/)?amq((?:[ \t]+[^\s|;&#>`]+)+)")
SHELL_STOP = {"|", "||", "&&", ";", "&", ">", "2>", "#", "\\"}


def code_spans(text: str) -> list[str]:
    """The page's code: each line of its fenced blocks, and each inline code span."""
    spans: list[str] = []
    fence: str | None = None
    for line in text.splitlines():
        stripped = line.lstrip()
        if stripped.startswith("```") or stripped.startswith("~~~"):
            fence = None if fence else stripped[:3]
            continue
        if fence:
            spans.append(line)
    return spans + INLINE_CODE.findall(prose(text))


def amq_calls(text: str) -> list[list[str]]:
    """The argument lists of every ``amq`` call in the page's code, each call up to the
    end of its line or a shell operator. Placeholder brackets are dropped (``[--mode
    M]`` gives ``--mode``)."""
    spans = code_spans(text)
    calls: list[list[str]] = []
    for span in spans:
        for m in AMQ_CALL.finditer(span):
            args: list[str] = []
            for token in m.group(1).split():
                if token in SHELL_STOP or token.startswith("#"):
                    break
                args.append(token.strip("[]"))
            if args:
                calls.append(args)
    return calls


def bad_amq_calls(calls: list[list[str]]) -> list[str]:
    import click

    from amqtransport.cli.main import cli

    bad: list[str] = []
    for args in calls:
        cmd: click.Command = cli
        ctx = click.Context(cli)
        words = ["amq"]
        for arg in args:
            if isinstance(cmd, click.Group) and not arg.startswith("-"):
                sub = cmd.get_command(ctx, arg)
                if sub is None:
                    if re.fullmatch(r"[a-z][a-z-]*", arg):  # not a placeholder (X, send/recv, demo:)
                        bad.append(f"`{' '.join(words)} {arg}`: no such command")
                    break
                cmd, words = sub, [*words, arg]
                continue
            if arg.startswith("-") and len(arg) > 1 and not arg[1:2].isdigit():
                name = arg.split("=", 1)[0]
                known = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} | {"-h", "--help"}
                if name not in known:
                    bad.append(f"`{' '.join(words)} {name}`: no such option")
    return bad


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_amq_commands_and_options_exist(path: Path) -> None:
    assert bad_amq_calls(amq_calls(path.read_text(encoding="utf-8"))) == []


def test_amq_command_checker_finds_bad_commands_and_options() -> None:
    page = (
        "Run `amq broker pair --mode replicated [--port P]` then `amq broker status --port 1 --json`.\n"
        "```sh\n"
        "amq send 'failover:(tcp://a:1)' /queue/x --count 5 --colour red &   # a made-up option\n"
        ".venv/bin/amq brokr run\n"
        "amq chaos run nemesis --rounds 3 --mode both | tee out   # --not-an-option after the pipe\n"
        "```\n"
        "The `amq` data source; `amq-ha-status`; `amq uri explain --json URI`.\n"
    )
    calls = amq_calls(page)
    assert ["broker", "pair", "--mode", "replicated", "--port", "P"] in calls
    assert bad_amq_calls(calls) == ["`amq send --colour`: no such option", "`amq brokr`: no such command"]


MAKE_CALL = re.compile(r"(?:^|(?<=[\s`(]))make ([a-z][\w-]*)")


def make_targets_named(text: str) -> set[str]:
    """``make TARGET`` in the page's code."""
    return {m.group(1) for span in code_spans(text) for m in MAKE_CALL.finditer(span)}


def test_make_targets_named_in_the_docs_exist() -> None:
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(encoding="utf-8"), re.MULTILINE))
    named = {(str(p.relative_to(ROOT)), t) for p in doc_files() for t in make_targets_named(p.read_text(encoding="utf-8"))}
    assert {"demo", "test", "wheel"} <= {t for _, t in named}
    assert make_targets_named("Run `make wheel`; to make the page\n```sh\nmake nosuch  # x\n```\n") == {"wheel", "nosuch"}
    assert sorted((page, t) for page, t in named if t not in targets) == []


def test_readme_error_tree_names_every_class_of_the_family() -> None:
    import amqtransport.errors as errors

    text = README.read_text(encoding="utf-8")
    tree = text[text.index("```text\nAmqTransportError"):]
    tree = tree[: tree.index("\n```", 1)]
    named = set(re.findall(r"\b[A-Z]\w+", tree))
    assert sorted(set(errors.__all__) - named) == [], "README's error tree misses these classes of amqtransport.errors"


def test_every_broker_config_key_is_documented() -> None:
    from amqtransport.broker.config import BrokerConfig

    text = (DOCS / "broker.md").read_text(encoding="utf-8")
    table = {key for row in re.findall(r"^\|([^|\n]*)\|", text, re.MULTILINE) for key in INLINE_CODE.findall(row)}
    assert sorted(set(BrokerConfig.model_fields) - table) == [], "keys missing from docs/broker.md's config table"


FENCED = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def fenced_blocks(text: str, language: str) -> list[str]:
    return [body for lang, body in FENCED.findall(text) if lang == language]


def bad_blocks(path: Path) -> list[str]:
    """Python blocks that do not compile; TOML blocks that do not parse, and, on the
    bridge page, bridge configs its parser refuses."""
    import tomllib

    from bridge.config import parse_config

    text = path.read_text(encoding="utf-8")
    bad: list[str] = []
    for body in fenced_blocks(text, "python"):
        try:
            compile(body, str(path), "exec")
        except SyntaxError as exc:
            bad.append(f"python block: {exc}")
    for body in fenced_blocks(text, "toml"):
        try:
            tomllib.loads(body)
            if path.name == "bridge.md":
                parse_config(body, source=path.name)
        except (tomllib.TOMLDecodeError, ValueError) as exc:
            bad.append(f"toml block: {exc}")
    return bad


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_python_and_toml_blocks_are_valid(path: Path) -> None:
    assert bad_blocks(path) == []


def test_block_checker_finds_bad_blocks(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "```python\nprint('ok')\n```\n```python\nprint('missing paren'\n```\n"
        "```toml\nkey = 1\n```\n```toml\nkey = \n```\n",
        encoding="utf-8",
    )
    bad = bad_blocks(page)
    assert len(bad) == 2 and bad[0].startswith("python block") and bad[1].startswith("toml block"), bad
    bridge_page = tmp_path / "bridge.md"  # there a TOML block is a bridge config
    bridge_page.write_text(
        '```toml\nlocal_uri = "tcp://127.0.0.1:1"\n[[network_connector]]\nname = "x"\nuri = "tcp://127.0.0.1:2"\n'
        "network_ttl = 0\n```\n",
        encoding="utf-8",
    )
    bad = bad_blocks(bridge_page)
    assert len(bad) == 1 and "network_ttl" in bad[0], bad
