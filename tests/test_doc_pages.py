"""The guides' commands that run on make demo's runs, run as written on the quickstart's.

The session's one quickstart run (conftest.quickstart_checkout) is the tutorial's recipe
under make demo's run names (demo-teacher, demo-ssl), in a folder laid out like a checkout
whose configs/local.yaml is the tiny config. Every block of docs/tutorial/ and
docs/how-to/ marked `# run by tests/test_doc_pages.py` runs there (a copy: the quickstart's
own test reruns it) as a reader would run it after `make demo`: bash blocks with -euo
pipefail, Python and SQL blocks in this interpreter, in the folder the marker names, a
placeholder replaced as it says (scripts/docs_check.py). `make docs-check` runs the same
blocks on the demo's own runs.
"""
from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import docs_check_module


@pytest.mark.slow  # ~2 minutes after the quickstart run the session shares
@pytest.mark.integration
def test_page_blocks_run_on_the_quickstarts_runs(quickstart_checkout, tmp_path):
    qs = quickstart_checkout
    assert qs.run.returncode == 0, qs.run.stdout[-3000:] + qs.run.stderr[-3000:]
    root = tmp_path / "checkout"
    shutil.copytree(qs.root, root, symlinks=True)
    dc = docs_check_module()
    blocks = dc.selected(dc.all_blocks(), (dc.PAGES_TEST,))
    pages = {b.page for b in blocks}
    assert {"docs/tutorial/demo.md", "docs/how-to/export.md",
            "docs/how-to/read-parquet.md"} <= pages, pages
    failures = dc.run_all(blocks, root, timeout=600)
    assert not failures, f"blocks that failed (their output is above): {failures}"
    # what the blocks say they make
    runs = root / "data" / "runs"
    for folder in ("demo-ssl/export", "demo-ssl/export-ctc", "demo-teacher/export-baseline"):
        checks = json.loads((runs / folder / "checks.json").read_text())
        assert checks["passed"], folder
    # the baseline's export took the acoustic scale decode tuned for the baseline
    decoding = json.loads((runs / "demo-teacher" / "export-baseline" / "decoding.json").read_text())
    assert decoding["acwt_from"].endswith("demo-teacher/decode-baseline/result.json"), decoding
    assert (runs / "demo-ssl" / "export-ctc" / "model.sherpa.int8.onnx").exists()
    day = json.loads((runs / "daily-2026-03-08" / "targets" / "_SUCCESS.json").read_text())
    assert day["counts"]["out"] > 0, day["counts"]
