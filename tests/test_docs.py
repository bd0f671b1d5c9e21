"""The docs: a strict build, references generated from the code, commands that parse.

- `mkdocs build --strict` (what `make docs` runs): a broken link, a missing page or a missing
  snippet fails here, so CI builds the docs strictly.
- The CLI and config references come from the parser and the schema
  (scripts/docs_reference.py): every key and flag is there, and a field added to a config
  section appears in the reference with no other edit.
- Every `amflow ...` command in a fenced shell block of docs/tutorial and docs/how-to parses
  with the real parser, and its `--set` overrides load (the key exists, the value fits),
  whether a test runs its block or not (blocks marked `# not run by the tests: <why>` are
  listed; which blocks run where: scripts/docs_check.py, tests/test_doc_commands.py).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import docs_check_module, script_module
from tests.test_doc_links import broken_site_links

ROOT = Path(__file__).resolve().parents[1]
# A shell line that runs amflow (perhaps after `do`, `then`, `time`, `nice -n N`).
AMFLOW_LINE = re.compile(r"^(?:(?:do|then|time|nice(?: -n -?\d+)?)\s+)*(?:\S*/)?amflow\s+")


def _generator():
    spec = importlib.util.spec_from_file_location("docs_reference",
                                                  ROOT / "scripts" / "docs_reference.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["docs_reference"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_docs_build_strictly(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    # no -q: with it mkdocs 1.6 no longer counts the warnings --strict fails on
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                          "-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, (
        "mkdocs build --strict failed (missing? pip install -e '.[docs]'):\n"
        + out.stdout[-3000:] + out.stderr[-5000:])
    for page in ["reference/cli/index.html", "reference/config/index.html", "index.html",
                 "reference/api/index.html", "reference/api/training/index.html"]:
        assert (tmp_path / "site" / page).exists(), page
    broken = broken_site_links(tmp_path / "site")  # what mkdocs's own check does not see
    assert not broken, "broken links on the built site:\n" + "\n".join(broken[:100])


def test_committed_references_are_current():
    """docs/reference/cli.md and config.md are committed, so Markdown links to them resolve
    in a repository browser as on the site; they must be what the code generates now."""
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "docs_reference.py"), "--check"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COLUMNS": "250", "AMFLOW_LOG_LEVEL": "DEBUG"})
    assert out.returncode == 0, out.stderr[-3000:]


def test_reference_check_sees_a_stale_page(tmp_path, capsys):
    gen = _generator()
    assert gen.main([], docs=tmp_path) == 0  # writes both pages
    assert gen.main(["--check"], docs=tmp_path) == 0
    page = tmp_path / "reference" / "cli.md"
    page.write_text(page.read_text().replace("| `--run-id` |", "| `--run-idx` |", 1))
    assert gen.main(["--check"], docs=tmp_path) == 1
    assert "docs/reference/cli.md is stale" in capsys.readouterr().err
    assert gen.main([], docs=tmp_path) == 0 and gen.main(["--check"], docs=tmp_path) == 0


def test_config_reference_lists_every_user_key():
    from core.config import user_keys

    md, _ = _generator().config_reference()
    listed = set(re.findall(r"^\| `([^`]+)` \|", md, re.M))
    assert listed == {k for k, _ in user_keys()}


def test_a_field_added_to_a_section_appears_with_no_other_edit(tmp_path, monkeypatch):
    """A synthetic schema in a module of its own: the generated page follows its source."""
    body = '''
from dataclasses import dataclass, field


@dataclass
class Section:
    """A section."""

    # What a means,
    # on two lines.
    a: int = 1
    b: str = "x"{new}


@dataclass
class Inner:
    lr: float = 0.1  # the learning rate


@dataclass
class Root:
    sec: Section = field(default_factory=Section)
    inner: Inner = field(default_factory=Inner)
'''
    monkeypatch.syspath_prepend(str(tmp_path))
    gen = _generator()

    def page(new: str) -> tuple[str, list[str]]:
        (tmp_path / "synthetic_schema.py").write_text(body.format(new=new))
        sys.modules.pop("synthetic_schema", None)
        importlib.invalidate_caches()
        return gen.config_reference(importlib.import_module("synthetic_schema").Root)

    md, missing = page("")
    assert "| `sec.a` | `int` | `1` | What a means, on two lines. |" in md
    assert "| `inner.lr` | `float` | `0.1` | the learning rate |" in md
    assert missing == ["sec.b"] and "sec.added" not in md
    md, missing = page("\n    added: list[str] = field(default_factory=lambda: [\"y\"])  # new one")
    assert '| `sec.added` | `list[str]` | `["y"]` | new one |' in md
    md, missing = page("\n    added: bool = False")
    assert "| `sec.added` | `bool` | `false` |  |" in md and missing == ["sec.b", "sec.added"]
    sys.modules.pop("synthetic_schema", None)


def test_cli_reference_lists_every_step_and_flag():
    from amflow.cli import build_parser

    gen = _generator()
    md = gen.cli_reference()
    parser = build_parser()
    (sub,) = [a for a in parser._actions if hasattr(a, "choices") and isinstance(a.choices, dict)]
    for name, p in sub.choices.items():
        section = md.split(f"\n## amflow {name}\n", 1)[1].split("\n## ", 1)[0]
        for action in p._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            for flag in action.option_strings:
                assert f"`{flag}`" in section, (name, flag)
            if action.help:
                assert gen._prose(action.help)[:40] in section, (name, action.help)


def test_api_reference_lists_every_public_function_and_class_of_the_libraries():
    import ast

    gen = _generator()
    pages = gen.api_reference()
    for package in gen.API_PACKAGES:
        md = pages[f"reference/api/{package}.md"]
        for name, path in gen.api_modules(package):
            assert f"\n## {name}\n" in md, name
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and gen._public(node.name):
                    assert f"### `{node.name}`" in md, (name, node.name)
    assert "core.config.loading" not in pages["reference/api/core.md"]  # the config reference's


def test_a_function_added_to_a_library_appears_in_the_api_reference(tmp_path):
    gen = _generator()
    lib = tmp_path / "lib"
    (lib / "_private").mkdir(parents=True)
    (lib / "__init__.py").write_text('"""The lib."""\n')
    (lib / "_private" / "x.py").write_text("def hidden(): ...\n")
    (lib / "mod.py").write_text('''"""A module.

Rows:

    a : int   the first <thing>
"""


def public(a: int, *, b: str = "x") -> list[int]:
    """Does <it>."""


def _helper(): ...


class Thing(Base):
    """A thing."""

    size: int = 3

    def run(self, n) -> None:
        """Runs."""

    def _inner(self): ...
''')
    assert [n for n, _ in gen.api_modules("lib", tmp_path)] == ["lib", "lib.mod"]
    md = "\n".join(gen.module_md("lib.mod", lib / "mod.py", tmp_path))
    assert "```text\na : int   the first <thing>\n```" in md  # a layout kept as drawn
    assert "def public(a: int, *, b: str='x') -> list[int]" in md and "Does &lt;it&gt;." in md
    assert "class Thing(Base)" in md and "size: int = 3" in md
    assert "#### `Thing.run`" in md and "def run(self, n) -> None" in md
    assert "_helper" not in md and "_inner" not in md and "hidden" not in md


def _amflow_commands(block: str) -> list[list[str]]:
    """Each `amflow ...` command of a block (continuation lines joined), as argv."""
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        line = line.strip().removeprefix("$ ")
        runs = AMFLOW_LINE.match(line)
        if runs:
            commands.append(shlex.split(line[runs.end():], comments=True))
    return commands


def doc_commands() -> tuple[list[tuple[str, list[str]]], list[tuple[str, str]]]:
    """(page:line, argv) of every amflow command in a shell block, marked run or not (a
    block that is not run still parses), and (page:line, why) of each block not run."""
    dc = docs_check_module()
    run, not_run = [], []
    for block in dc.all_blocks():
        if block.lang not in dc.SHELL:
            continue
        if block.marker and block.marker.runner is None:
            not_run.append((block.where(), block.marker.why))
        run += [(block.where(), argv) for argv in _amflow_commands(block.body)]
    return run, not_run


def test_doc_commands_parse_and_their_overrides_load():
    from amflow.cli import STEPS, build_parser
    from core.config import ConfigError, load_config

    run, not_run = doc_commands()
    assert run, "no amflow command found in docs/tutorial or docs/how-to"
    parser, failures = build_parser(), []
    for where, argv in run:
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # `amflow --help` prints, exits 0
                args = parser.parse_args(argv)
        except SystemExit as exc:
            if exc.code:
                failures.append(f"{where}: amflow {' '.join(argv)}: does not parse")
            continue
        config = ROOT / (args.config or "configs/local.yaml")  # the CLI's default
        try:
            load_config(str(config) if config.exists() else None,
                         [*args.overrides, *STEPS[args.step].sets])
        except ConfigError as exc:
            failures.append(f"{where}: amflow {' '.join(argv)}: {exc}")
    print(f"\n{len(run)} documented commands parsed; {len(not_run)} blocks not run:")
    for where, why in not_run:
        print(f"  {where}: {why}")
    assert not failures, "\n".join(failures)


def test_sample_output_on_the_pages_is_its_generated_file():
    """A page's sample region (`<!-- sample: FILE -->`) shows FILE's text, which `make
    docs-samples` writes from a run (scripts/docs_samples.py)."""
    samples = script_module("docs_samples")
    assert samples.pages(), "no page shows a generated sample"
    assert all((ROOT / name).exists() for name in samples.SAMPLES), "run make docs-samples"
    assert samples.stale_regions() == []


def test_a_sample_region_that_differs_from_its_file_is_found(tmp_path, monkeypatch):
    samples = script_module("docs_samples")
    (tmp_path / "docs").mkdir()
    (tmp_path / "out.txt").write_text("| a | 1 |\n")
    page = tmp_path / "docs" / "p.md"
    page.write_text("x\n<!-- sample: out.txt (made) -->\n```text\n| a | 2 |\n```\n"
                    "<!-- /sample -->\ny\n")
    monkeypatch.setattr(samples, "ROOT", tmp_path)
    assert [s.split(":")[0] for s in samples.stale_regions(tmp_path)] == ["docs/p.md"]
    samples.rewrite_pages(tmp_path)
    assert page.read_text() == ("x\n<!-- sample: out.txt (made) -->\n```text\n| a | 1 |\n"
                                "```\n<!-- /sample -->\ny\n")
    assert samples.stale_regions(tmp_path) == []


def test_readme_is_a_guide_not_a_log():
    """At most 200 lines, one date (the results table's), no commit hashes."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    assert len(re.findall(r"\b20\d\d-\d\d-\d\d\b", text)) == 1
    hashes = [w for w in re.findall(r"\b[0-9a-f]{7,40}\b", text)
              if re.search(r"\d", w) and re.search(r"[a-f]", w)]
    assert not hashes, hashes
