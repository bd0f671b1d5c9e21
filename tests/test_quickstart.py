"""The quickstart (`make quickstart`: scripts/quickstart.sh on configs/tiny.yaml).

- End to end, the suite's smoke test: every step of both runs finishes (its _SUCCESS.json),
  the commands it ran are the ones docs/tutorial/quickstart.md lists, and the WER table
  printed at the end has a row per decoded model, each WER a number in [0, 100] inside its
  95 % CI and equal to the WER in that decode's result.json.
- Its dry run (DRY_RUN=1, seconds) prints exactly the tutorial's commands.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.integration

RUN = "qs"
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


def _quickstart(store: Path | None, logs: Path, **extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.update({
        "RUN_ID": RUN,
        "QUICKSTART_SETS": f"storage.root={store} data.corpus={store / 'corpus'}" if store else "",
        # the checkout under test, and the interpreter running the tests (its amflow)
        "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        "QUICKSTART_LOGS": str(logs),
        **extra,
    })
    return subprocess.run(["bash", str(ROOT / "scripts" / "quickstart.sh")], env=env,
                          capture_output=True, text=True, timeout=3600)


def _printed_commands(stdout: str, root: Path, sets: str = "") -> list[str]:
    """The `$ amflow ...` lines the script printed, in the tutorial's spelling: the run ids
    as $RUN_ID-..., storage.root as $ROOT, without the test's own overrides."""
    out = []
    for line in stdout.splitlines():
        if line.startswith("$ amflow "):
            line = line[2:].replace(sets, "").replace(str(root), "$ROOT")
            out.append(re.sub(rf"\b{RUN}-(teacher|ssl)\b", r"$RUN_ID-\1", line))
    return out


def _tutorial_commands() -> list[str]:
    """The commands of the tutorial's block that starts with `amflow corpus`."""
    blocks = re.findall(r"^```bash\n(.*?)^```", TUTORIAL.read_text(), re.M | re.S)
    (block,) = [b for b in blocks if b.startswith("amflow corpus")]
    return [" ".join(line.split()) for line in block.replace("\\\n", " ").splitlines()]


def test_the_tutorial_lists_the_commands_the_script_runs(tmp_path):
    done = _quickstart(None, tmp_path / "logs", DRY_RUN="1")
    assert done.returncode == 0, done.stderr[-3000:]
    printed = _printed_commands(done.stdout, ROOT / "data" / "quickstart")
    assert printed == _tutorial_commands()
    assert len(printed) == 1 + sum(map(len, STEPS.values())) + 1  # corpus, steps, compare
    assert not list(tmp_path.iterdir())  # a dry run writes nothing


@pytest.mark.slow  # under 3 minutes on 2 cores, ~190 CPU-seconds (docs/tutorial/quickstart.md)
def test_quickstart_runs_every_step_and_prints_the_wer_table(tmp_path):
    store, logs = tmp_path / "store", tmp_path / "logs"
    done = _quickstart(store, logs)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    sets = f" --set storage.root={store} --set data.corpus={store / 'corpus'}"
    assert _printed_commands(done.stdout, store, sets) == _tutorial_commands()
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
    # the tiny CTC student learned from the labeled transcripts and the kept pseudo-labels
    ctc = json.loads((store / "runs" / f"{RUN}-ssl" / "train-ctc" / "_SUCCESS.json").read_text())
    assert ctc["metrics"]["transcripts"]["pseudo"] > 0, ctc["metrics"]
    assert json.loads((store / "runs" / f"{RUN}-ssl" / "decode-ctc" / "result.json")
                      .read_text())["model_kind"] == "ctc"
