"""The README and the docs pages: every relative link resolves, and nothing is stale.

These run without mkdocs; CI's `mkdocs build --strict` checks the rendered site too.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(
    [
        ROOT / "README.md",
        ROOT / "examples" / "README.md",
        ROOT / "benchmarks" / "README.md",
        *DOCS.rglob("*.md"),
    ]
)

QUICK_START = (
    "pip install torch==2.13.0 && pip install -e . && commlib bench\n"
    "pip install torch==2.13.0 && pip install torch==2.13.0 -e '.[test,integrations,mpi]'"
    " && python -m pytest\n"
)

_FENCE = re.compile(r"^ {0,3}(```|~~~)")
_CODE_SPAN = re.compile(r"(`+).*?\1")
# [text](target) and ![alt](target); the text may hold one level of brackets or code
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_ATTR_ID = re.compile(r"\{[^}]*#([\w-]+)[^}]*\}\s*$")


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    out, fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        m = _FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif m.group(1) == fence:
                fence = None
            continue
        if fence is None:
            out.append((number, line))
    return out


def _links(page: Path) -> list[tuple[int, str]]:
    return [
        (number, m.group(1))
        for number, line in _prose_lines(page.read_text())
        for m in _LINK.finditer(_CODE_SPAN.sub("", line))
    ]


def _markdown_slug(title: str) -> str:
    """Python-Markdown's toc slugify, which mkdocs uses for heading ids."""
    value = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode()
    value = re.sub(r"[^\w\s-]", "", value).strip().lower()
    return re.sub(r"[-\s]+", "-", value)


def _github_slug(title: str) -> str:
    """GitHub's heading anchors (README.md and any page read on GitHub)."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    anchors: set[str] = set()
    for _, line in _prose_lines(page.read_text()):
        m = _HEADING.match(line)
        if not m:
            continue
        title = m.group(2)
        attr = _ATTR_ID.search(title)
        if attr:
            anchors.add(attr.group(1))
            title = title[: attr.start()]
        # headings render their code spans and links as text
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title).replace("`", "")
        anchors |= {_markdown_slug(title), _github_slug(title)}
    return anchors


def _relative(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.parametrize("page", PAGES, ids=_relative)
def test_every_relative_link_resolves(page: Path):
    broken = []
    for number, target in _links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
            continue  # http(s), mailto: not checked offline
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{_relative(page)}:{number}: {target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{_relative(page)}:{number}: {target} (no heading #{anchor})")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_pages_are_found():
    # the link test must not pass by finding nothing
    assert len(PAGES) > 10
    assert sum(len(_links(p)) for p in PAGES) > 40


def test_anchor_slugs_match_the_renderers():
    assert _markdown_slug("The engine: commlib._engine") == "the-engine-commlib_engine"
    assert _github_slug("4. Run the conformance kit") == "4-run-the-conformance-kit"
    assert _markdown_slug("Benchmark: `commlib bench`".replace("`", "")) == (
        "benchmark-commlib-bench"
    )


def test_readme_is_short_and_starts_with_the_quick_start():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    # CI runs the second command: it stays the README's first code block, unchanged
    first_block = re.search(r"```bash\n(.*?)```", text, re.DOTALL)
    assert first_block is not None and first_block.group(1) == QUICK_START
    assert text.index("## Quick start") < text.index("```bash")
    assert text.count("\n## ") >= 3 and text.index("## Quick start") == text.index("\n## ") + 1


def test_the_site_index_lists_every_page_the_readme_lists():
    # the README's contents table links docs/X.md, the site's index X.md: the same pages
    readme = set(
        re.findall(r"^\| \[[^\]]*\]\(docs/([^)#]+)\)", (ROOT / "README.md").read_text(), re.M)
    )
    index = set(re.findall(r"^\| \[[^\]]*\]\(([^)#]+)\)", (DOCS / "index.md").read_text(), re.M))
    assert len(readme) >= 10
    assert readme - index == set(), f"docs/index.md lacks the README's rows for {readme - index}"


def test_api_overview_lists_every_export():
    tree = ast.parse((ROOT / "commlib" / "__init__.py").read_text())
    exports = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
    )
    overview = (DOCS / "api" / "commlib.md").read_text()
    missing = [name for name in exports if f"[{name}]" not in overview and name != "__version__"]
    assert not missing, f"docs/api/commlib.md does not list {missing}"


def test_bench_page_is_generated_from_bench_json(tmp_path: Path):
    out = tmp_path / "bench.md"
    # world 2, world 4, dispatch on torch's fake process group
    results = [str(DOCS / name) for name in ("bench.json", "bench-4.json", "bench-dispatch.json")]
    subprocess.run(
        [sys.executable, str(DOCS / "make_bench_md.py"), *results, str(out)],
        cwd=ROOT,
        check=True,
        timeout=120,
    )
    assert out.read_text() == (DOCS / "bench.md").read_text(), (
        "docs/bench.md is stale or edited by hand: "
        "python docs/make_bench_md.py docs/bench.json docs/bench-4.json docs/bench-dispatch.json "
        "docs/bench.md"
    )
