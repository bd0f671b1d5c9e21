"""The commands of the tutorial and the how-to guides: which of them run where, and a
runner for those that run on a finished demo (`make docs-check`).

Every code block of docs/tutorial/ and docs/how-to/ that holds commands (bash, python,
sql) says in its first line whether anything runs it, so that a reader knows which
commands are checked and why the others are not:

    # run by tests/test_own_corpus.py           a test runs this block (tests/test_doc_commands.py
                                                keeps the registry: which test, which page)
    # run by tests/test_doc_pages.py in data (R = demo-teacher)
                                                run as written on the quickstart's runs,
                                                and by `make docs-check` on the demo's
    # run by make docs-check (R = demo-teacher)  run after `make demo` only (not in CI)
    # not run by the tests: needs an AWS account (starts an EC2 cluster)

(`--` instead of `#` in SQL.) `in DIR` is the folder, under the checkout, the block runs
in; `NAME = value` says which run a placeholder of the page (a run id `R`) stands for
when it is run. tests/test_doc_commands.py fails on a command in a block with none of
these lines. A block runs as written otherwise: bash with -euo pipefail, Python in the
checkout's interpreter, SQL in DuckDB.

`python scripts/docs_check.py` (`make docs-check`) runs every block marked for
tests/test_doc_pages.py or for make docs-check on this checkout, after `make demo` (its
runs demo-teacher and demo-ssl); `--root DIR` on another folder laid out like it (what
tests/test_doc_pages.py does with the quickstart's runs), `--list` only lists them.
"""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE_DIRS = ["docs/tutorial", "docs/how-to"]
SHELL = {"bash", "sh", "shell", "console"}
CODE = {"python", "py", "sql"}
FENCE = re.compile(r"^([ \t]*)(```+|~~~+)[ \t]*([\w+-]*)[^\n]*\n(.*?)^[ \t]*\2[ \t]*$",
                   re.M | re.S)
MARK = re.compile(r"^(?:#|--)\s*(?:(?P<not_run>not run by the tests:\s*(?P<why>\S.*))"
                  r"|run by (?P<runner>tests/[\w/]+\.py|make docs-check)"
                  r"(?:\s+in\s+(?P<where>[^\s(]+))?\s*(?:\((?P<names>[^)]*)\))?\s*$)")
PAGES_TEST = "tests/test_doc_pages.py"
DOCS_CHECK = "make docs-check"
# make demo's runs, which the blocks run here name
DEMO_RUNS = ("demo-teacher", "demo-ssl")
SQL = ("import sys, duckdb\n"
       "for stmt in filter(str.strip, sys.argv[1].split(';')):\n"
       "    print(duckdb.sql(stmt))\n")


@dataclasses.dataclass
class Marker:
    runner: str | None  # "tests/....py" or "make docs-check"; None: not run
    why: str = ""       # not run: the reason
    where: str = ""     # the folder it runs in, under the checkout
    names: dict[str, str] = dataclasses.field(default_factory=dict)  # placeholder -> value


@dataclasses.dataclass
class Block:
    page: str  # docs/how-to/x.md
    line: int  # the opening fence's line
    lang: str
    body: str  # dedented, its marker line included
    marker: Marker | None
    bad_marker: str = ""  # a first line that looks like a marker but is not one

    def where(self) -> str:
        return f"{self.page}:{self.line}"


def parse_marker(first: str) -> tuple[Marker | None, str]:
    """(the marker of a block's first line, or None; the line when it means to be a
    marker and is malformed)."""
    m = MARK.match(first.strip())
    if not m:
        looks = re.match(r"^(#|--)\s*(not run|run by)\b", first.strip())
        return None, first.strip() if looks else ""
    if m["not_run"]:
        return Marker(None, why=m["why"]), ""
    names = {}
    for pair in filter(str.strip, (m["names"] or "").split(",")):
        if "=" not in pair:
            return None, first.strip()
        k, v = (s.strip() for s in pair.split("=", 1))
        names[k] = v
    return Marker(m["runner"], where=m["where"] or "", names=names), ""


def page_blocks(page: Path, root: Path = ROOT) -> list[Block]:
    """Every fenced block of a page, with its language and marker."""
    text = page.read_text(encoding="utf-8")
    out = []
    for m in FENCE.finditer(text):
        body = textwrap.dedent(m.group(4))
        first = next((x for x in body.splitlines() if x.strip()), "")
        marker, bad = parse_marker(first)
        out.append(Block(str(page.relative_to(root)), text.count("\n", 0, m.start()) + 1,
                         m.group(3).lower(), body, marker, bad))
    return out


def all_blocks(root: Path = ROOT) -> list[Block]:
    return [b for d in PAGE_DIRS for p in sorted((root / d).glob("*.md"))
            for b in page_blocks(p, root)]


def commands(block: Block) -> list[str]:
    """The commands of a block: each logical line of a shell block (continuations joined,
    comments and blank lines left out); a Python or SQL block is one."""
    if block.lang in CODE:
        return [f"{block.lang} block"]
    if block.lang not in SHELL:
        return []
    lines = block.body.replace("\\\n", " ").splitlines()
    return [x.strip() for x in lines if x.strip() and not x.strip().startswith("#")]


def substitute(text: str, names: dict[str, str]) -> str:
    """The block with each placeholder (a whole word: `R`, `T.pt`) replaced."""
    for name, value in names.items():
        text = re.sub(rf"(?<![\w.]){re.escape(name)}(?![\w])", value, text)
    return text


def argv(block: Block) -> list[str]:
    body = substitute(block.body, block.marker.names if block.marker else {})
    if block.lang in SHELL:
        return ["bash", "-euo", "pipefail", "-c", body]
    if block.lang == "sql":
        return [sys.executable, "-c", SQL, body]
    return [sys.executable, "-c", body]


def environment(root: Path) -> dict[str, str]:
    """The shell of a reader in the checkout at `root`, running this checkout's code."""
    env = {k: v for k, v in os.environ.items() if k != "AMFLOW_CONFIG"}
    env["PATH"] = os.pathsep.join([str(root / ".venv" / "bin"), str(ROOT / ".venv" / "bin"),
                                   env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run_block(block: Block, root: Path, timeout: float = 1800) -> subprocess.CompletedProcess:
    """Run one block as written (its placeholders replaced) in `root`/its folder."""
    cwd = root / (block.marker.where if block.marker else "")
    return subprocess.run(argv(block), cwd=cwd, env=environment(root), capture_output=True,
                          text=True, timeout=timeout)


def _text(out: bytes | str | None) -> str:
    return out.decode(errors="replace") if isinstance(out, bytes) else out or ""


def selected(blocks: list[Block], runners: tuple[str, ...]) -> list[Block]:
    return [b for b in blocks if b.marker and b.marker.runner in runners]


def run_all(blocks: list[Block], root: Path, timeout: float = 1800) -> list[str]:
    """Run the blocks one after another, each page's in its order; the failures."""
    failures = []
    for block in blocks:
        start = time.monotonic()
        try:
            done = run_block(block, root, timeout)
        except subprocess.TimeoutExpired as exc:
            done = subprocess.CompletedProcess(exc.cmd, f"timed out after {timeout:.0f} s",
                                               _text(exc.stdout), _text(exc.stderr))
        took = time.monotonic() - start
        if done.returncode == 0:
            print(f"ok      {block.where()} ({took:.0f} s)", flush=True)
            continue
        print(f"FAILED  {block.where()} ({took:.0f} s, exit {done.returncode}):\n"
              + textwrap.indent((done.stdout[-2000:] + done.stderr[-3000:]).rstrip(), "    "),
              flush=True)
        failures.append(block.where())
    return failures


def main(args: list[str]) -> int:
    root = Path(args[args.index("--root") + 1]).resolve() if "--root" in args else ROOT
    blocks = selected(all_blocks(), (PAGES_TEST, DOCS_CHECK))
    if "--list" in args:
        for b in blocks:
            print(f"{b.where()}  ({b.marker.runner})")
        return 0
    missing = [r for r in DEMO_RUNS if not (root / "data" / "runs" / r / "_run.json").exists()]
    if missing:
        print(f"docs-check: no run {', '.join(missing)} under {root}/data/runs: run `make "
              "demo` first (the blocks run on its runs)", file=sys.stderr)
        return 2
    failures = run_all(blocks, root)
    print(f"docs-check: {len(blocks) - len(failures)} of {len(blocks)} blocks ran"
          + (": failed " + ", ".join(failures) if failures else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
