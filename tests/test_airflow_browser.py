"""A person's path through the Airflow UI, in headless Debian Chromium (playwright):
log in, open ssl_student, trigger it from the form, see the run succeed, open a task log.
Screenshots go to test-artifacts/airflow/."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.airflow_env import ROOT, calls, fake_config, shared_standalone

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
SHOTS = ROOT / "test-artifacts" / "airflow"


@pytest.fixture(scope="module")
def airflow(tmp_path_factory):
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} missing: run scripts/system-deps.sh (installs Debian chromium)")
    return shared_standalone(tmp_path_factory.mktemp("standalone"))


def test_login_trigger_from_form_run_succeeds_and_task_log_shows(airflow, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    shutil.rmtree(SHOTS, ignore_errors=True)
    SHOTS.mkdir(parents=True)
    work = tmp_path / "work"
    cfg = fake_config(work, plan={"train": {"seconds": 2, "lines": 4}}, poll_s=0.5)

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(60_000)
        try:
            page.goto(f"{airflow.base}/")
            page.fill("input[name=username]", "admin")
            page.fill("input[name=password]", airflow.password)
            page.screenshot(path=SHOTS / "01-login.png")
            page.click("button[type=submit]")
            page.wait_for_url(f"{airflow.base}/")

            page.goto(f"{airflow.base}/dags/ssl_student")
            expect(page.get_by_text("repartition").first).to_be_visible()
            page.screenshot(path=SHOTS / "02-dag.png")

            page.get_by_test_id("trigger-dag-button").click()
            form = page.get_by_role("dialog")
            expect(form.get_by_text("Hours of audio")).to_be_visible()
            expect(form.get_by_text("Training algorithm")).to_be_visible()
            page.fill("input[name=element_config]", str(cfg))
            page.fill("input[name=element_teacher]", "/models/teacher.pt")
            page.screenshot(path=SHOTS / "03-trigger-form.png", full_page=True)
            page.get_by_test_id("trigger-dag-submit").click()
            page.wait_for_url("**/dags/ssl_student/runs/**")
            run_id = page.url.split("/runs/")[1].split("/")[0].split("?")[0]
            from urllib.parse import unquote

            run_id = unquote(run_id)
            assert airflow.wait_run("ssl_student", run_id, timeout=240) == "success"
            page.reload()
            expect(page.get_by_text("Success").first).to_be_visible()
            page.screenshot(path=SHOTS / "04-run-success.png")

            page.goto(f"{airflow.base}/dags/ssl_student/runs/{run_id}/tasks/features")
            expect(page.get_by_text("[features] 3/3 shards (100%)")).to_be_visible()
            expect(page.get_by_text("[amflow features] done in")).to_be_visible()
            page.screenshot(path=SHOTS / "05-task-log.png", full_page=True)
        finally:
            page.screenshot(path=SHOTS / "99-last.png")
            browser.close()

    # The form's values reached the steps.
    (run_dir,) = [d for d in (work / "store" / "runs").iterdir() if d.is_dir()]
    steps = [c["step"] for c in calls(work / "store", run_dir.name)]
    assert steps == ["select", "features", "targets", "repartition", "train", "evaluate"]
    targets = [c for c in calls(work / "store", run_dir.name) if c["step"] == "targets"][0]
    assert "targets.teacher=/models/teacher.pt" in targets["argv"]
    for name in ("01-login", "02-dag", "03-trigger-form", "04-run-success", "05-task-log"):
        assert (SHOTS / f"{name}.png").stat().st_size > 10_000
