"""Airflow on your own corpus (docs/how-to/own-corpus.md, "In Airflow"): the how-to's
mine.yaml beside a Kaldi corpus with untranscribed audio, `amflow import` as the page says,
then, in headless Chromium, the `teacher` DAG triggered from its form with only the config
field set to mine.yaml. The `ssl_student` run the teacher's model starts reads the same
file: the teacher, the baseline and the SSL student land under mine/runs/, and each
run's amflow tab shows its WERs. Real steps (tiny models): ~10 min on 2 cores, so not in
make test (make test-corpus-ui)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from core.config import parse_override
from tests.airflow_env import ROOT, _q, shared_standalone
from tests.own_corpus_data import make_kaldi_corpus
from tests.test_airflow_browser import CHROMIUM, _logged_in_page
from tests.test_airflow_browser import patient_expect  # noqa: F401 - autouse: waits 60 s
from tests.test_own_corpus import TINY_SSL, howto_blocks

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.corpus_ui]

SHOTS = ROOT / "test-artifacts" / "airflow-own-corpus"


@pytest.fixture(scope="module")
def airflow(tmp_path_factory):
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} missing: run scripts/system-deps.sh (installs Debian chromium)")
    return shared_standalone(tmp_path_factory.mktemp("standalone"))


def _with_sets(yaml_text: str, sets: list[str]) -> str:
    """The page's YAML with the test's tiny model settings written into it (the form has
    one config field: everything a run needs is in the file)."""
    data = yaml.safe_load(yaml_text)
    for item in sets:
        key, value = parse_override(item)
        *parents, leaf = key.split(".")
        node = data
        for name in parents:
            node = node.setdefault(name, {})
        node[leaf] = value
    return yaml.safe_dump(data, sort_keys=False)


def _import(home: Path) -> None:
    """`amflow import` as the how-to's semi-supervised block runs it, from mine.yaml's folder."""
    _, commands = howto_blocks(1)
    out = subprocess.run([str(ROOT / ".venv" / "bin" / "amflow"), *commands[0][1:]], cwd=home,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]


def _dag_runs(airflow, dag: str) -> list[dict]:
    return airflow.get(f"/api/v2/dags/{dag}/dagRuns?order_by=-logical_date")["dag_runs"]


def test_teacher_triggered_from_the_form_on_your_yaml_then_the_student_it_starts(airflow,
                                                                                 tmp_path):
    from playwright.sync_api import expect

    SHOTS.mkdir(parents=True, exist_ok=True)
    home = tmp_path / "project"
    make_kaldi_corpus(home / "kaldi", rate=8000, utts={"train": 12, "dev": 4, "test": 4},
                      transcribed=0.5)
    yaml_block, _ = howto_blocks(1)
    mine = home / "mine.yaml"
    mine.write_text(_with_sets(yaml_block, TINY_SSL))
    _import(home)
    for dag in ("teacher", "ssl_student"):
        airflow.request("PATCH", f"/api/v2/dags/{dag}", {"is_paused": False})
    before = {r["dag_run_id"] for r in _dag_runs(airflow, "ssl_student")}

    with _logged_in_page(airflow, last_shot=SHOTS / "99-last.png") as page:
        page.goto(f"{airflow.base}/dags/teacher")
        page.get_by_test_id("trigger-dag-button").click()
        expect(page.locator("input[name=element_config]")).to_be_visible()
        page.fill("input[name=element_config]", str(mine))  # the only field changed
        page.screenshot(path=SHOTS / "01-teacher-form.png", full_page=True)
        page.get_by_test_id("trigger-dag-submit").dispatch_event("click")
        page.wait_for_url("**/dags/teacher/runs/**")
        from urllib.parse import unquote

        teacher_run = unquote(page.url.split("/runs/")[1].split("/")[0].split("?")[0])
        assert airflow.wait_run("teacher", teacher_run, timeout=1500) == "success", \
            airflow.task_instances("teacher", teacher_run)

        def student_started():
            new = [r for r in _dag_runs(airflow, "ssl_student")
                   if r["dag_run_id"] not in before]
            return new[0]["dag_run_id"] if new else None

        student_run = airflow.wait(student_started, 300, "the ssl_student run the teacher's "
                                   "model event starts")
        assert airflow.wait_run("ssl_student", student_run, timeout=1500) == "success", \
            airflow.task_instances("ssl_student", student_run)
        for dag, run in (("teacher", teacher_run), ("ssl_student", student_run)):
            page.goto(f"{airflow.base}/amflow/runs/{dag}/{_q(run)}")
            expect(page.get_by_text("WER").first).to_be_visible()
            page.screenshot(path=SHOTS / f"02-{dag}-amflow-tab.png", full_page=True)
        tab = airflow.get(f"/amflow/runs/ssl_student/{_q(student_run)}", raw=True)

    # Every run went under mine.yaml's storage.root (./mine next to it), not the checkout's.
    runs = home / "mine" / "runs"
    finished = {p.parent.relative_to(runs).as_posix() for p in runs.glob("*/*/_SUCCESS.json")}
    (teacher_id,) = {p.split("/")[0] for p in finished if p.endswith("/train-teacher")}
    (student_id,) = {p.split("/")[0] for p in finished if p.endswith("/targets")}
    for folder in ("train-teacher", "train-baseline", "decode-teacher", "decode-baseline"):
        assert f"{teacher_id}/{folder}" in finished, sorted(finished)
    # (the CTC students are off in Airflow's form by default: configs/recipes/ssl.yaml)
    for folder in ("targets", "repartition", "train", "evaluate", "decode"):
        assert f"{student_id}/{folder}" in finished, sorted(finished)
    targets = json.loads((runs / student_id / "targets" / "_SUCCESS.json").read_text())
    assert f"{teacher_id}/train-teacher/" in targets["inputs"]["teacher"]
    assert targets["counts"]["out"] > 0  # the teacher labelled the untranscribed audio
    assert not (ROOT / "mine").exists()  # nothing went to the checkout
    assert "decode" in tab and "%" in tab, tab[-2000:]
