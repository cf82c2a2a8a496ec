"""The documentation stays navigable: README.md is a short front door, docs/ the reference.

Checked for README.md and every page under docs/:

- every relative link (``[text](target)``, ``[text]: target``) names a file or directory
  that exists, and a ``#fragment`` names a heading of the target page (GitHub's
  anchors: lower case, punctuation dropped, spaces to hyphens, ``-1`` for repeats);
- every repository path written in code style (```amqtransport/broker/core.py```,
  ```tests/ha```, globs such as ```tests/chaos/test_proxy_*.py```) exists, so a page
  cannot keep naming a module after it moved;
- every test named in code style as ```tests/FILE.py::test_name``` (a promise's proof,
  e.g. in docs/reliability.md) is defined in that file;
- README.md is at most 250 lines, and reaches every page under docs/ (directly or
  through the docs index).

Fenced code blocks are skipped: they hold commands and output, not links.
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
