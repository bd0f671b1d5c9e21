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
    # the WER's CI from the metrics, the conditions' from result.json
    decoded = join(root, "runs", "S", "decode", "result.json")
    st.write_json(decoded, {"per_condition_ci95": {"DP1": [0.25, 0.35]}})
    _step(st, root, "S", "decode", "2026-01-02T11:00:00", out=decoded,
          metrics={"wer": 0.4, "wer_ci95": [0.35, 0.45],
                   "per_condition_wer": {c: 0.3 for c in CONDS}})
    st.write_bytes(join(root, "runs", "S", "report", "accuracy.png"), _png(20, 10))


def _check(html: str) -> None:
    head = re.search(r"<tr><th>condition</th>(.*?)</tr>", html).group(1)
    assert "teacher (run T) FA %" in head and "baseline (run T) FA %" in head
    assert "SSL student FA % <span class=stale>(stale)</span>" in head
    assert "WER % (95 % CI)" in head
    dp1 = re.search(r"<tr><th>DP1</th>(.*?)</tr>", html).group(1)
    assert re.findall(r"<td class=n>([\d.]*)</td>", dp1)[:3] == ["80.0", "70.0", "75.0"]
    # WER with its CI: overall and per condition
    assert "<td class=n>30.0 <span class=ci>(25.0–35.0)</span></td>" in dp1
    every = re.search(r"<tr><th>all</th>(.*?)</tr>", html).group(1)
    assert "<td class=n>40.0 <span class=ci>(35.0–45.0)</span></td>" in every
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


def test_compare_page_base_is_explicit_and_gaps_say_why(tmp_path):
    """The base is the one picked (or the first ticked), put first; one run shows its
    WER alone; a run with no decode yet and a decode the base lacks say so."""
    from amflow.airflow_view import PICK_RUNS, order_runs, render_compare
    from amflow.services.compared_runs import load_run
    from decoding.compare import compare
    from tests.test_compare import _rows, write_run

    assert order_runs(["a", "b", "c"], "c") == ["c", "a", "b"]
    assert order_runs(["a", "b"], "") == ["a", "b"]
    assert order_runs(["a", "b"], "z") == ["z", "a", "b"]  # picked, not ticked: added
    st, root = Storage(), str(tmp_path)
    write_run(tmp_path, "old", {"decode": _rows([3] * 40)})
    write_run(tmp_path, "new", {"decode": _rows([1] * 40), "decode-seq": _rows([1] * 40)})
    write_run(tmp_path, "fresh", {})  # trained, not decoded yet

    runs = order_runs(["fresh", "new", "old"], "old")
    page = render_compare(compare([load_run(st, root, r) for r in runs]),
                          ["fresh", "new", "old"], runs, "c.yaml")
    assert "<h3>WER, base <code>old</code></h3>" in page
    assert "<option value='old' selected>old</option>" in page
    assert "<td class=ns>the base</td>" in page
    assert "<td class=ns>no decode-seq in the base</td>" in page
    assert "No WER for <code>fresh</code>: no decode of it has finished yet" in page

    alone = render_compare(compare([load_run(st, root, "new")]), ["new"], ["new"], "c.yaml")
    assert "one run: nothing to test it against" in alone and "–" in alone  # WER and CI
    empty = render_compare(compare([load_run(st, root, "fresh")]), ["fresh"], ["fresh"], "c")
    assert "No decode result in these runs yet" in empty
    assert "Tick one run" in render_compare(None, ["a"], [], "c.yaml", PICK_RUNS)
    assert "first ticked is the base" not in page
