"""The architecture page's "A library from a Python session" block, run as it stands: a
library called on plain paths (a corpus folder), with no run, step or config file."""
from __future__ import annotations

import ast
import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "docs" / "explanation" / "architecture.md"
HEADING = "## A library from a Python session"


def _snippet() -> str:
    """The first ```python block under HEADING (up to the next heading)."""
    text = PAGE.read_text()
    assert HEADING in text, f"{PAGE} lost its section {HEADING!r}"
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    m = re.search(r"^```python\n(.*?)^```", section, re.M | re.S)
    assert m, f"no ```python block under {HEADING!r} in {PAGE}"
    return m.group(1)


def test_the_snippet_imports_only_libraries_and_the_base():
    """What the page shows is a library on plain paths: nothing of the app or the layout."""
    tree = ast.parse(_snippet())
    mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    mods |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert mods and all(m.split(".")[0] in ("core", "tasks", "alignment", "training",
                                            "decoding", "serving") for m in mods), mods
    assert "core.runs" not in mods


def test_the_snippet_featurises_a_tiny_corpus(tiny_corpus, capsys):
    code, n = re.subn(r'^corpus = "[^"]*"', f'corpus = "{tiny_corpus}"', _snippet(),
                      flags=re.M)
    assert n == 1, "the snippet's `corpus = \"...\"` line moved: the test sets it"
    scope: dict = {}
    exec(compile(code, str(PAGE), "exec"), scope)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and not scope["rejects"], (lines, scope["rejects"])
    for line, (utt, rows) in zip(lines, scope["feats"].items()):
        assert line == f"{utt} {rows.shape}"
        assert rows.shape[0] > 0 and rows.shape[1] == scope["fcfg"].num_mel_bins * scope[
            "fcfg"].stack
