"""The quickstart (`make quickstart`: `amflow run ssl --config configs/tiny.yaml`).

- End to end, the suite's smoke test: the tutorial's command as written (the session's
  one quickstart run, conftest.quickstart_checkout, under make demo's run names, which
  tests/test_doc_pages.py then uses) runs every step of both runs in one
  process (each finished: its _SUCCESS.json), and the WER table printed at the end has a
  row per decoded model, each WER a number in [0, 100] inside its 95 % CI and equal to the
  WER in that decode's result.json; run again with the same run id, every step is kept.
- The tutorial's table of steps is the recipe's, in its order.
"""
from __future__ import annotations

import json
import re
import subprocess

import pytest

from tests.conftest import QUICKSTART_RUN, ROOT, docs_check_module

pytestmark = pytest.mark.integration

RUN = QUICKSTART_RUN
# The steps the quickstart runs, as they lie under <storage.root>/runs/<run_id>/.
STEPS = {
    f"{RUN}-teacher": ["select", "align", "features", "repartition", "train-teacher",
                       "train-baseline", "lm", "decode-teacher", "decode-baseline"],
    f"{RUN}-ssl": ["select", "align", "features", "lm", "targets", "pseudolabel", "repartition",
                   "train", "train-ctc", "decode", "decode-ctc"],
}
ROW = re.compile(r"^\| (?P<run>\S+) \| (?P<decode>\S+) \| (?P<wer>[^|]+) \| "
                 r"(?P<lo>[0-9.]+)-(?P<hi>[0-9.]+) \|")


TUTORIAL = ROOT / "docs" / "tutorial" / "quickstart.md"
# The table the tutorial shows: a run's, written by `make docs-samples` (scripts/docs_samples.py)
SAMPLE = ROOT / "docs" / "samples" / "quickstart-compare.txt"


def _table(text: str) -> dict[tuple[str, str], re.Match]:
    """The WER table's rows by (run suffix: teacher or ssl, decode step)."""
    rows = [m for m in map(ROW.match, text.splitlines()) if m]
    return {(m["run"].rsplit("-", 1)[1], m["decode"]): m for m in rows}


def test_the_tutorial_lists_the_recipes_steps():
    from amflow.recipes.definition import load_recipe

    ids = re.findall(r"^\| `([a-z]+\.[a-z-]+)` \|", TUTORIAL.read_text(), re.M)
    assert ids == load_recipe("ssl").for_cli().ids()


def test_the_tutorials_words_on_its_sample_table_hold():
    """What the tutorial says of the table it shows, checked on the table."""
    wer = {k: float(m["wer"]) for k, m in _table(SAMPLE.read_text()).items()}
    assert set(wer) == {("teacher", "decode-teacher"), ("teacher", "decode-baseline"),
                        ("ssl", "decode"), ("ssl", "decode-ctc")}
    teacher = wer[("teacher", "decode-teacher")]  # "well ahead of both students"
    assert teacher + 5 < min(wer[("teacher", "decode-baseline")], wer[("ssl", "decode")])
    assert max(wer, key=wer.get) == ("ssl", "decode-ctc")  # "spells poorly"


@pytest.mark.slow  # ~5 minutes on 2 cores (docs/results/2026-12-07-one-command.md)
def test_quickstart_runs_every_step_and_prints_the_wer_table(quickstart_checkout):
    """The tutorial's command as written (conftest.quickstart_checkout: its block, with
    --run-id and --logs)."""
    done, store = quickstart_checkout.run, quickstart_checkout.store
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    from amflow.recipes.definition import load_recipe

    headers = {line.split()[1] for line in done.stdout.splitlines() if line.startswith("=== ")}
    assert headers == {*load_recipe("ssl").for_cli().ids(), "compare"}
    assert len(headers) == 1 + sum(map(len, STEPS.values())) + 1  # corpus, steps, compare
    assert json.loads((store / "corpus" / "_SUCCESS.json").read_text())
    for run, steps in STEPS.items():
        for step in steps:
            marker = store / "runs" / run / step / "_SUCCESS.json"
            assert marker.is_file(), f"{run}/{step} did not finish"
            assert json.loads(marker.read_text())["step"]
    rows = {(m["run"], m["decode"]): m for m in map(ROW.match, done.stdout.splitlines()) if m}
    assert set(rows) == {(f"{RUN}-teacher", "decode-teacher"),
                         (f"{RUN}-teacher", "decode-baseline"), (f"{RUN}-ssl", "decode"),
                         (f"{RUN}-ssl", "decode-ctc")}, \
        done.stdout[-3000:]
    for (run, decode), m in rows.items():
        wer, lo, hi = float(m["wer"]), float(m["lo"]), float(m["hi"])
        assert 0 <= lo <= wer <= hi <= 100, m.group(0)
        result = json.loads((store / "runs" / run / decode / "result.json").read_text())
        assert abs(100 * result["wer"] - wer) < 0.006, (run, decode)
    # the table the tutorial shows is what this code gives: the same rows, model kinds and
    # paths (the run's name and storage aside), each WER inside the sample's 95 % CI
    sample = _table(SAMPLE.read_text())
    fresh = _table(done.stdout)
    assert set(fresh) == set(sample)
    for key, m in fresh.items():
        s = sample[key]
        assert s.string.rsplit("/", 1)[1] == m.string.rsplit("/", 1)[1], key  # model (kind)
        assert float(s["lo"]) <= float(m["wer"]) <= float(s["hi"]), (
            f"{key}: WER {m['wer']} outside the tutorial's sample's CI {s['lo']}-{s['hi']}: "
            "the sample is stale, run make docs-samples")
    # the tiny CTC student learned from the labeled transcripts and the kept pseudo-labels
    ctc = json.loads((store / "runs" / f"{RUN}-ssl" / "train-ctc" / "_SUCCESS.json").read_text())
    assert ctc["metrics"]["transcripts"]["pseudo"] > 0, ctc["metrics"]
    assert json.loads((store / "runs" / f"{RUN}-ssl" / "decode-ctc" / "result.json")
                      .read_text())["model_kind"] == "ctc"
    # the same run id again keeps every step: nothing is redone
    again = subprocess.run(["bash", "-c", quickstart_checkout.command + " --from ssl.train"],
                           cwd=quickstart_checkout.root, capture_output=True, text=True,
                           env=docs_check_module().environment(quickstart_checkout.root),
                           timeout=3600)
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-4000:]
    assert json.loads(again.stdout.splitlines()[-1].split(" ", 1)[1])["kept"] == 4
