"""amflow.airflow_view: the amflow tab's page, from a run's files on local disk or S3."""
from __future__ import annotations

import re

from amflow.airflow_view import render_run, teacher_run_of
from core.config import load_config
from core.storage import Storage, join

from tests.fake_amflow import _png

CONDS = ("DP1", "DP2", "DP3", "DP4", "DP5")


def _result(fa: float) -> dict:
    per_cond = {c: round(fa - 0.05 * i, 4) for i, c in enumerate(CONDS)}
    return {"frame_accuracy": fa, "per": 1 - fa, "per_condition": per_cond,
            "per_condition_per": {c: round(1 - a, 4) for c, a in per_cond.items()}}


def _step(st: Storage, root: str, run: str, name: str, finished: str, **extra) -> None:
    summary = {"step": name.split("-")[0], "run_id": run, "wall_s": 12.5,
               "started_at": finished, "finished_at": finished,
               "counts": {"in": 10, "out": 8, "rejected": 2}, **extra}
    st.write_json(join(root, "runs", run, name, "_SUCCESS.json"), summary)


def _two_runs(st: Storage, root: str) -> None:
    """A teacher run (teacher + baseline) and a student run trained from its teacher."""
    for name, fa in (("teacher", 0.8), ("baseline", 0.7)):
        _step(st, root, "T", f"train-{name}", "2026-01-01T10:00:00")
        _step(st, root, "T", f"evaluate-{name}", "2026-01-01T11:00:00")
        st.write_json(join(root, "runs", "T", f"evaluate-{name}", "result.json"), _result(fa))
    teacher = join(root, "runs", "T", "train-teacher", "model.pt")
    _step(st, root, "S", "targets", "2026-01-02T09:00:00", inputs={"teacher": teacher})
    # the student's train re-ran after its evaluation: that result is stale
    _step(st, root, "S", "evaluate", "2026-01-02T10:00:00")
    _step(st, root, "S", "train", "2026-01-02T12:00:00")
    st.write_json(join(root, "runs", "S", "evaluate", "result.json"), _result(0.75))
    _step(st, root, "S", "decode", "2026-01-02T11:00:00",
          metrics={"wer": 0.4, "per_condition_wer": {c: 0.3 for c in CONDS}})
    st.write_bytes(join(root, "runs", "S", "report", "accuracy.png"), _png(20, 10))


def _check(html: str) -> None:
    head = re.search(r"<tr><th>condition</th>(.*?)</tr>", html).group(1)
    assert "teacher (run T) FA %" in head and "baseline (run T) FA %" in head
    assert "SSL student FA % <span class=stale>(stale)</span>" in head and "WER %" in head
    dp1 = re.search(r"<tr><th>DP1</th>(.*?)</tr>", html).group(1)
    assert re.findall(r"<td class=n>([\d.]*)</td>", dp1)[:3] == ["80.0", "70.0", "75.0"]
    assert "clear the evaluate task" in html
    assert "report/accuracy.png" in html and "data:image/png;base64,iVBOR" in html
    assert "<td>targets</td><td class=n>12.5</td><td class=n>10</td><td class=n>8</td>" \
           "<td class=n>2</td>" in html


def test_student_run_page_local(tmp_path):
    st, root = Storage(), str(tmp_path / "store")
    _two_runs(st, root)
    assert teacher_run_of({"targets": {"inputs": {"teacher": f"{root}/runs/T/train-teacher/model.pt"}}}) == "T"
    _check(render_run(st, root, "S", title="DAG ssl_student."))
    assert "No step of this run" in render_run(st, root, "nothing-yet")


def test_student_run_page_s3(s3_bucket):
    bucket, overrides = s3_bucket
    cfg = load_config(None, [f"storage.root=s3://{bucket}/store", *overrides])
    st = Storage(cfg.storage)
    _two_runs(st, cfg.storage.root)
    _check(render_run(st, cfg.storage.root, "S"))
