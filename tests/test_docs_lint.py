"""Docs lint (fast, no build): no page of the tutorial or how-to guides names a run that
nothing creates.

A `runs/<id>` path in a fenced code block of docs/tutorial/ or docs/how-to/ must name a run
that a reader following the page has:
- one an earlier command on the page starts: `amflow select ... --run-id <id>` (select is
  the first step of every run: the others read what it and the steps after it wrote) or
  `amflow run <recipe> --run-id <id>`, in an earlier block or earlier in the same block.
  Any other step naming the run does not make it: `amflow export --run-id demo-ctc` on a
  page whose reader has no run `demo-ctc` fails with "needs step ... to have finished
  first", so a page saying it is what the lint catches;
- one of `make demo`'s runs (read from scripts/demo.sh: `$PREFIX-teacher`, `$PREFIX-ssl`
  with its default prefix; `DEMO_PREFIX=x make demo` on the page makes x's), or of
  `make quickstart` (`amflow run ssl`: a run per run of the recipe, `<RUN_ID>-teacher`,
  `<RUN_ID>-ssl`; its ids start `ssl-` by default, or `qs-`/`quickstart-`; `RUN_ID=x make
  quickstart` makes x's);
- or a placeholder: `<run>`, `$RUN_ID`, `{run}`, or a name in capitals (`R`, `RUN`).
A page that names `runs/teacher/...` (no command makes run `teacher`) fails here: a reader
copying the command gets "not found".
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE_DIRS = ["docs/tutorial", "docs/how-to"]
FENCE = re.compile(r"^[ \t]*(```+|~~~+)[^\n]*\n(.*?)^[ \t]*\1", re.M | re.S)
RUN_PATH = re.compile(r"\bruns/([^/\s`'\"),;\]]+)")
# a command that starts a run: `amflow select` / `amflow run` (any path or prefix before it)
STARTS_RUN = re.compile(r"(?:^|[\s/;&|(])amflow\s+(?:select|run)\s.*?--run-id[ =]+['\"]?([^\s'\"\\]+)")
# `RUN_ID=x make quickstart` / `DEMO_PREFIX=x make demo`: the script's runs under that id
SCRIPT_ENV = re.compile(r"\b(RUN_ID|DEMO_PREFIX)=['\"]?([^\s'\"]+)['\"]?(?:\s+\S+=\S+)*\s+make\s+(quickstart|demo)\b")
PLACEHOLDER = re.compile(r"[<>${}*]|^[A-Z][A-Z0-9_-]*$")
QUICKSTART_PREFIXES = ("quickstart-", "qs-", "ssl-")


def script_runs(script: Path, var: str) -> tuple[str, list[str]]:
    """(the default of `var`, the suffixes of the run ids the script makes from it): from
    lines such as `PREFIX=${DEMO_PREFIX:-demo}` and `SSL_RUN="$PREFIX-ssl"`."""
    text = script.read_text()
    name, default = re.search(rf"^(\w+)=\$\{{{var}:-([^}}]*)\}}", text, re.M).groups()
    suffixes = re.findall(rf'^\w+_RUN="\${name}(-[\w-]+)"', text, re.M)
    assert suffixes, f"{script}: no run ids made from ${name} found"
    return default, suffixes


def _made_by_scripts() -> tuple[set[str], dict[str, list[str]]]:
    demo_default, demo_suffixes = script_runs(ROOT / "scripts" / "demo.sh", "DEMO_PREFIX")
    from amflow.recipes.definition import load_recipe

    qs_suffixes = [f"-{run}" for run in load_recipe("ssl").runs]
    demo_runs = {demo_default + s for s in demo_suffixes}
    return demo_runs, {"demo": demo_suffixes, "quickstart": qs_suffixes}


def unmade_runs(text: str, demo_runs: set[str], suffixes: dict[str, list[str]]) -> list[str]:
    """The `runs/<id>` paths in the page's fenced blocks whose run nothing before them makes."""
    made = set(demo_runs)
    bad = []
    for block in FENCE.finditer(text):
        body = block.group(2)
        # a run a line makes counts from that line on (its own paths, later lines, blocks)
        for line in body.replace("\\\n", " ").splitlines():  # continuations joined
            made.update(STARTS_RUN.findall(line))
            for _var, value, target in SCRIPT_ENV.findall(line):
                made.update(value + s for s in suffixes[target])
            for m in RUN_PATH.finditer(line):
                run = m.group(1)
                if not (run in made or PLACEHOLDER.search(run) or run.startswith(QUICKSTART_PREFIXES)):
                    bad.append(f"runs/{run} (in: {line.strip()[:100]})")
    return bad


def test_pages_name_only_runs_that_something_makes():
    demo_runs, suffixes = _made_by_scripts()
    failures = []
    for folder in PAGE_DIRS:
        for page in sorted((ROOT / folder).glob("*.md")):
            for bad in unmade_runs(page.read_text(), demo_runs, suffixes):
                failures.append(f"{page.relative_to(ROOT)}: {bad}")
    assert not failures, ("runs named in code blocks that no earlier command on the page, "
                          "make demo or make quickstart creates:\n" + "\n".join(failures))


def test_the_demo_runs_come_from_the_script():
    demo_runs, suffixes = _made_by_scripts()
    assert demo_runs == {"demo-teacher", "demo-ssl"}
    assert suffixes["quickstart"] == ["-teacher", "-ssl"]


def test_the_lint_flags_a_run_nothing_makes_and_accepts_what_is_made():
    demo_runs, suffixes = {"demo-teacher", "demo-ssl"}, {"demo": ["-teacher", "-ssl"],
                                                        "quickstart": ["-teacher", "-ssl"]}
    page = "\n".join([
        "```bash",
        "amflow select --config c.yaml \\",
        "    --run-id d1 --set select.hours=1",                              # starts d1
        "amflow targets --run-id d1 --set targets.teacher=data/runs/teacher/train-teacher/model.pt",
        "amflow export --run-id demo-ctc --out data/runs/demo-ctc/x",     # export starts no run
        ".venv/bin/amflow decode --run-id d1 --out data/runs/d1/x.json",  # d1 was started
        "amflow serve --model data/runs/demo-ssl/train/model.pt",       # make demo's
        "amflow decode --model data/runs/d1/train/model.pt",            # made above
        "ls data/runs/<run>/ runs/$RUN_ID-ssl runs/R/decode",           # placeholders
        "```",
        "```python",
        'd = "data/runs/mine/export"',                                  # made later: too late
        "```",
        "```bash",
        "amflow select --run-id mine",
        "RUN_ID=x1 make quickstart && cat data/quickstart/runs/x1-ssl/decode/result.json",
        "DEMO_PREFIX=try2 make demo; ls data/runs/try2-teacher data/runs/try3-ssl",
        "cat data/runs/mine/select/_SUCCESS.json data/runs/quickstart-20260101-ssl/x",
        "```",
    ])
    bad = unmade_runs(page, demo_runs, suffixes)
    assert [b.split(" ")[0] for b in bad] == ["runs/teacher", "runs/demo-ctc", "runs/mine",
                                              "runs/try3-ssl"]
