"""Every command in the tutorial and the how-to guides is run by a test or marked not run,
with the reason (fast: nothing runs here).

A code block of docs/tutorial/ or docs/how-to/ holding commands (bash, python, sql) starts
with a line saying so (scripts/docs_check.py): `# run by tests/<file>.py`, `# run by make
docs-check` or `# not run by the tests: <why>`. Each command line of a block with none of
them is listed as a failure. A block marked as run by a test names a file of RUNNERS, the
registry below: the tests that run page blocks, each with the pages it reads and its test
functions; the file must exist, define those functions and name the page it reads.
"""
from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import docs_check_module

ROOT = Path(__file__).resolve().parents[1]


# Which tests run which page blocks: file -> (the pages it reads, the functions that run
# them). None for pages: it runs every block that names it (it selects them by marker).
RUNNERS: dict[str, tuple[list[str] | None, list[str]]] = {
    "tests/test_own_corpus.py": (
        ["docs/how-to/own-corpus.md"],
        ["test_own_corpus_recipe_from_kaldi_dirs_to_wer",
         "test_own_corpus_semi_supervised_in_two_commands"]),
    "tests/test_airflow_standalone.py": (
        ["docs/how-to/airflow.md"], ["test_documented_backfill_commands_do_what_the_text_says"]),
    "tests/test_export_ctc.py": (
        ["docs/how-to/export.md"],
        ["test_sherpa_onnx_graph_search_from_the_folder_gives_amflows_tlg_words"]),
    "tests/test_quickstart.py": (
        ["docs/tutorial/quickstart.md"],
        ["test_quickstart_runs_every_step_and_prints_the_wer_table"]),
    "tests/test_doc_pages.py": (None, ["test_page_blocks_run_on_the_quickstarts_runs"]),
}


def _defined(path: Path) -> set[str]:
    return {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)}


def test_every_command_is_run_by_a_test_or_marked_not_run():
    dc = docs_check_module()
    unchecked, bad, counts = [], [], {"run by a test": 0, "make docs-check": 0, "not run": 0}
    for block in dc.all_blocks():
        if not block.lang:
            bad.append(f"{block.where()}: a block without a language (bash for commands, "
                       "text for output)")
        if block.bad_marker:
            bad.append(f"{block.where()}: not a marker scripts/docs_check.py reads: "
                       f"{block.bad_marker!r}")
        lines = dc.commands(block)
        if block.marker is None:
            unchecked += [f"{block.where()}: {line[:110]}" for line in lines]
        elif block.marker.runner is None:
            counts["not run"] += len(lines)
        elif block.marker.runner == dc.DOCS_CHECK:
            counts["make docs-check"] += len(lines)
        else:
            counts["run by a test"] += len(lines)
    print(f"\ncommand lines in docs/tutorial and docs/how-to: {counts}, unchecked "
          f"{len(unchecked)}")
    assert not bad, "\n".join(bad)
    assert not unchecked, (
        f"{len(unchecked)} commands neither run by a test nor marked: start their block with "
        "`# run by tests/<file>.py` (a test of RUNNERS in tests/test_doc_commands.py runs it), "
        "`# run by make docs-check` or `# not run by the tests: <why>`:\n" + "\n".join(unchecked))
    assert counts["run by a test"] > 0 and counts["not run"] > 0


def test_the_tests_named_run_the_pages_they_are_named_on():
    dc = docs_check_module()
    failures = []
    for block in dc.all_blocks():
        runner = block.marker.runner if block.marker else None
        if runner is None or runner == dc.DOCS_CHECK:
            continue
        if runner not in RUNNERS:
            failures.append(f"{block.where()}: {runner} is not in RUNNERS")
            continue
        pages, _ = RUNNERS[runner]
        if pages is not None and block.page not in pages:
            failures.append(f"{block.where()}: RUNNERS does not list {block.page} for {runner}")
    for runner, (pages, tests) in RUNNERS.items():
        path = ROOT / runner
        if not path.exists():
            failures.append(f"{runner}: no such file")
            continue
        missing = set(tests) - _defined(path)
        if missing:
            failures.append(f"{runner}: no test {sorted(missing)}")
        text = path.read_text()
        failures += [f"{runner} does not read {p}" for p in pages or []
                     if Path(p).name not in text]
    assert not failures, "\n".join(failures)


def test_markers_and_placeholders():
    dc = docs_check_module()
    m, bad = dc.parse_marker("# run by tests/test_doc_pages.py in data (R = demo-teacher, T.pt = x/model.pt)")
    assert not bad and (m.runner, m.where, m.names) == (
        "tests/test_doc_pages.py", "data", {"R": "demo-teacher", "T.pt": "x/model.pt"})
    m, _ = dc.parse_marker("-- not run by the tests: needs an AWS account (ECR)")
    assert m.runner is None and m.why == "needs an AWS account (ECR)"
    assert dc.parse_marker("# run by make docs-check")[0].runner == "make docs-check"
    assert dc.parse_marker("# not run: why")[1] == "# not run: why"  # the old form: flagged
    assert dc.parse_marker("# run by hand")[1]
    assert dc.parse_marker("amflow select --run-id R") == (None, "")
    text = "amflow x --run-id R runs/R/a R-ssl --set train.pseudolabels=R DEMO_R RUN T.pt T.ptx"
    assert dc.substitute(text, {"R": "demo-ssl", "T.pt": "m.pt"}) == (
        "amflow x --run-id demo-ssl runs/demo-ssl/a demo-ssl-ssl --set train.pseudolabels=demo-ssl "
        "DEMO_R RUN m.pt T.ptx")


def test_command_lines_of_a_block():
    dc = docs_check_module()
    shell = dc.Block("p.md", 1, "bash", "# run by make docs-check\namflow a \\\n  --b c\n\n"
                     "# a comment\nfor x in 1; do\n  echo $x\ndone\n", None)
    assert dc.commands(shell) == ["amflow a    --b c", "for x in 1; do", "echo $x", "done"]
    assert dc.commands(dc.Block("p.md", 1, "python", "import x\nx.y()\n", None)) == ["python block"]
    assert dc.commands(dc.Block("p.md", 1, "text", "amflow select: error\n", None)) == []


def test_make_docs_check_runs_the_script():
    make = (ROOT / "Makefile").read_text()
    assert "\ndocs-check:" in make and "scripts/docs_check.py" in make.split("\ndocs-check:")[1]


def test_the_runner_runs_a_block_where_its_marker_says_and_reports_failures(tmp_path, capsys):
    dc = docs_check_module()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.txt").write_text("hello")
    ok = dc.Block("p.md", 3, "bash", "# run by make docs-check in data (R = x)\n"
                  "test \"$(cat R.txt)\" = hello\n", dc.parse_marker("# run by make docs-check in data (R = x)")[0])
    py = dc.Block("p.md", 9, "python", "# run by make docs-check in data\n"
                  "assert open('x.txt').read() == 'hello'\n", dc.parse_marker("# run by make docs-check in data")[0])
    bad = dc.Block("p.md", 20, "bash", "# run by make docs-check\nfalse\necho never\n",
                   dc.parse_marker("# run by make docs-check")[0])
    assert dc.run_all([ok, py, bad], tmp_path) == ["p.md:20"]
    out = capsys.readouterr().out
    assert "ok      p.md:3" in out and "ok      p.md:9" in out and "FAILED  p.md:20" in out
    assert "never" not in out  # -e: the block stops at its first failing command
