"""Links in the docs resolve where they are read: on the built site and in a repository
browser.

- On the site: every relative href and src of every page of `mkdocs build` (a strict
  build, as `make docs`) names a file of the site, and its #anchor an id on that page
  (tests/test_docs.py builds the site and runs broken_site_links over it). mkdocs checks
  the links it rewrites from Markdown; this also covers what it does not see (raw HTML,
  the theme's own links, what a hook writes).
- In a repository browser (GitHub shows the Markdown files as they are committed): every
  relative link of docs/**/*.md and README.md names a committed file or folder, so the
  generated reference pages must be committed too (scripts/docs_reference.py).
"""
from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

ROOT = Path(__file__).resolve().parents[1]
# [text](target) and <a href="target">, outside code (fenced blocks and `spans` are dropped)
MD_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCED = re.compile(r"^[ \t]*(```+|~~~+).*?^[ \t]*\1", re.M | re.S)


class _Refs(HTMLParser):
    """The href/src values and the ids of one HTML page."""

    def __init__(self):
        super().__init__()
        self.refs: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("href", "src") and value:
                self.refs.append(value)
            elif name in ("id", "name") and value:
                self.ids.add(value)


def _local(ref: str) -> bool:
    parts = urlsplit(ref)
    return not (parts.scheme or parts.netloc or ref.startswith(("//", "mailto:", "data:")))


def broken_site_links(site: Path) -> list[str]:
    """`page: ref` for each relative link of the site that names no file, or an anchor its
    page does not have."""
    pages = {}
    for html in site.rglob("*.html"):
        parser = _Refs()
        parser.feed(html.read_text(encoding="utf-8", errors="replace"))
        pages[html] = parser
    broken = []
    for html, parser in pages.items():
        for ref in parser.refs:
            if not _local(ref):
                continue
            parts = urlsplit(ref)
            path = unquote(parts.path)
            # /x: from the site's root (the 404 page's links, as mkdocs writes them)
            base = site if path.startswith("/") else html.parent
            target = (base / path.lstrip("/")).resolve() if path else html
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                broken.append(f"{html.relative_to(site)}: {ref}")
            elif parts.fragment and target in pages and unquote(parts.fragment) not in pages[target].ids:
                broken.append(f"{html.relative_to(site)}: {ref} (no such anchor)")
    return broken


def markdown_links(text: str) -> list[str]:
    text = FENCED.sub("", text)
    text = re.sub(r"`[^`\n]*`", "", text)
    return MD_LINK.findall(text) + re.findall(r"<a [^>]*href=\"([^\"]+)\"", text)


def broken_repository_links(files: list[Path]) -> list[str]:
    broken = []
    for md in files:
        for ref in markdown_links(md.read_text(encoding="utf-8")):
            parts = urlsplit(ref)
            if not _local(ref) or not parts.path:
                continue
            if not (md.parent / unquote(parts.path)).exists():
                broken.append(f"{md.relative_to(ROOT)}: {ref}")
    return broken


def test_markdown_links_resolve_in_a_repository_browser():
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = broken_repository_links(files)
    assert not broken, ("relative links that name no committed file (a generated page not "
                        "committed? python scripts/docs_reference.py):\n" + "\n".join(broken))


def test_the_link_checks_find_what_is_broken(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "index.html").write_text(
        '<h2 id="x">x</h2><a href="../b/">b</a><a href="../c/">c</a>'
        '<a href="#x">x</a><a href="#y">y</a><a href="../b/#z">z</a>'
        '<img src="../img.png"><a href="https://example.org/nowhere">ext</a>'
        '<a href="/b/">root</a><a href="/d/">d</a>')
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "index.html").write_text('<p id="z">z</p>')
    assert broken_site_links(tmp_path) == ["a/index.html: ../c/", "a/index.html: #y (no such anchor)",
                                          "a/index.html: ../img.png", "a/index.html: /d/"]
    refs = markdown_links("[a](x.md) `[b](y.md)` [c](<z.md#q> \"t\")\n```\n[d](w.md)\n```\n"
                          '<a href="v.md">v</a> [e](https://x.org)')
    assert refs == ["x.md", "z.md#q", "https://x.org", "v.md"]

