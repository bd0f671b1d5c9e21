import pytest

from core.runs import StepContext, StepError
from amflow.steps.report import run
from tasks.report import relative_error_reduction, table_ii


def _eval(base: float) -> dict:
    return {"frame_accuracy": base, "per": 1 - base,
            "per_condition": {f"DP{i}": base - 0.05 * i for i in range(1, 6)},
            "per_condition_per": {f"DP{i}": 0.3 + 0.05 * i for i in range(1, 6)}}


def test_relative_error_reduction():
    assert relative_error_reduction(0.8, 0.84) == pytest.approx(0.2)
    assert relative_error_reduction(0.8, 0.8) == 0.0
    assert relative_error_reduction(1.0, 0.9) == 0.0


def test_table_ii_rows():
    rows = table_ii(_eval(0.95), _eval(0.8), _eval(0.85))
    assert [r["condition"] for r in rows] == ["DP1", "DP2", "DP3", "DP4", "DP5", "all"]
    dp2 = rows[1]
    assert dp2["baseline_fa"] == pytest.approx(0.7) and dp2["ssl_fa"] == pytest.approx(0.75)
    assert dp2["rel_fer_reduction"] == pytest.approx(0.05 / 0.3)


def test_table_ii_by_transcripts_alone_keeps_per():
    # evaluations of a corpus with no frame reference: PER only, no frame-error reduction
    def by_text(per: float) -> dict:
        return {"frame_accuracy": None, "per": per, "per_condition": {"DP1": None},
                "per_condition_per": {"DP1": per}}

    rows = table_ii(by_text(0.2), by_text(0.3), by_text(0.25))
    assert [r["condition"] for r in rows] == ["DP1", "all"]
    assert rows[0]["ssl_per"] == 0.25 and rows[0]["rel_fer_reduction"] is None
    from tasks.report import bar_png, render_table_ii
    assert "| DP1 | – | – | – | 20.0 | 30.0 | 25.0 | – |" in render_table_ii(rows)
    assert bar_png(rows)[:4] == b"\x89PNG"


def test_report_writes_markdown_and_pngs(local_cfg):
    cfg = local_cfg("report.teacher_run=t1")
    teacher = StepContext(cfg, "t1", "evaluate-teacher")
    teacher.storage.write_json(teacher.path("result.json"), _eval(0.95))
    teacher.storage.write_json(teacher.other("evaluate-baseline", "result.json"), _eval(0.8))
    teacher.finish(inputs={}, counts={"in": 3, "out": 2, "rejected": 1},
                   metrics={"audio_hours": 0.1, "x_real_time": 300.0})
    ssl = StepContext(cfg, "s1", "evaluate")
    ssl.storage.write_json(ssl.path("result.json"), _eval(0.86))
    ssl.storage.write_text(ssl.other("train", "metrics.jsonl"),
                           '{"loss": 2.0, "frames_seen": 10}\n{"loss": 1.0, "frames_seen": 20}\n')
    summary = run(StepContext(cfg, "s1", "report"))
    md = ssl.storage.read_text(ssl.other("report", "report.md"))
    assert md.startswith("# amflow report")
    assert md.index("| condition |") < md.index("## Steps")
    assert "| DP5 |" in md and "| t1 | evaluate-teacher |" in md
    assert ssl.storage.exists(ssl.other("report", "accuracy.png"))
    assert ssl.storage.exists(ssl.other("report", "learning_curves.png"))
    assert summary["metrics"]["table_ii"][0]["condition"] == "DP1"


def test_report_names_missing_evaluations(local_cfg):
    cfg = local_cfg()
    with pytest.raises(StepError, match="baseline"):
        run(StepContext(cfg, "nothing", "report"))


def _decode(wer: float) -> dict:
    return {"wer": wer, "per_condition": {f"DP{i}": wer + 0.02 * i for i in range(1, 6)}}


def test_sequence_rows_keep_the_ce_rows_beside(local_cfg):
    """The sequence-trained models' WER next to the same models' CE WER, the gain of
    sequence training and SSL's WERR once both are sequence-trained."""
    cfg = local_cfg("report.teacher_run=t1")
    t = StepContext(cfg, "t1", "evaluate-teacher")
    for rel, value in (("evaluate-baseline", _eval(0.8)), ("decode-baseline", _decode(0.3)),
                       ("decode-sequence-baseline", _decode(0.27))):
        t.storage.write_json(t.other(rel, "result.json"), value)
    ssl = StepContext(cfg, "s1", "evaluate")
    for rel, value in (("evaluate", _eval(0.86)), ("decode", _decode(0.2)),
                       ("decode-sequence", _decode(0.18))):
        ssl.storage.write_json(ssl.other(rel, "result.json"), value)
    rows = run(StepContext(cfg, "s1", "report"))["metrics"]["table_ii_wer_sequence"]
    every = rows[-1]
    assert every["condition"] == "all" and every["teacher_seq"] is None
    assert every["baseline_gain"] == pytest.approx(0.1)
    assert every["ssl_gain"] == pytest.approx(0.1)
    assert every["werr_seq"] == pytest.approx((0.27 - 0.18) / 0.27)
    md = ssl.storage.read_text(ssl.other("report", "report.md"))
    assert "| baseline CE WER % | baseline seq. WER % | baseline gain % |" in md
    assert "teacher CE WER" not in md  # no sequence-trained teacher: no teacher columns
    assert md.index("## Word error rate") < md.index("## After sequence training") < \
        md.index("## Frame accuracy")


def test_wer_section_names_the_graph_the_student_was_decoded_on():
    from tasks.report import wer_section

    ctx = {"graph": {"context": "triphone", "classes": 200}, "lexicon": "l", "lm": "g",
           "tune_split": "dev", "acwt": 0.3}
    assert "Decoded with H o C o L o G, 200 classes" in "\n".join(wer_section([], ctx))
    phones = {**ctx, "graph": {"classes": 67}}
    assert "Decoded with H o L o G, 67 classes" in "\n".join(wer_section([], phones))


def test_report_puts_the_ctc_students_beside_the_hybrid_ones(local_cfg):
    """decode-ctc-baseline / decode-ctc of the SSL run: rows with CIs per condition, the
    CTC SSL student's WERR over the CTC baseline, its WER x the hybrid SSL student's, and
    paired tests against the hybrid SSL student (from small fake decode JSONs)."""
    import json

    cfg = local_cfg("report.teacher_run=t1")
    t = StepContext(cfg, "t1", "evaluate-teacher")
    t.storage.write_json(t.other("evaluate-baseline", "result.json"), _eval(0.8))
    t.storage.write_json(t.other("decode-baseline", "result.json"), _decode(0.3))
    ssl = StepContext(cfg, "s1", "evaluate")
    ssl.storage.write_json(ssl.other("evaluate", "result.json"), _eval(0.86))

    def decoded(rel, wer, errors):
        ssl.storage.write_json(ssl.other(rel, "result.json"),
                               {**_decode(wer), "wer_ci95": [wer - 0.02, wer + 0.02],
                                "model_kind": "ctc" if "ctc" in rel else "lstm"})
        rows = [{"utt_id": f"u{i}", "condition": "DP1", "ref": "", "hyp": "",
                 "errors": e, "ref_words": 10} for i, e in enumerate(errors)]
        ssl.storage.write_text(ssl.other(rel, "hyps.jsonl"),
                               "".join(json.dumps(r) + "\n" for r in rows))

    decoded("decode", 0.2, [2] * 30)
    decoded("decode-ctc-baseline", 0.4, [4] * 30)
    decoded("decode-ctc", 0.22, [2, 3] * 15)
    summary = run(StepContext(cfg, "s1", "report"))
    e2e = summary["metrics"]["table_ii_e2e"]
    names = [r["model"] for r in e2e["rows"]]
    assert names == ["baseline", "ssl", "ctc_baseline", "ctc_ssl"]
    ctc = e2e["rows"][-1]
    assert ctc["x_hybrid_ssl"] == pytest.approx(1.1) and ctc["wer_ci95"] == [0.2, 0.24]
    assert e2e["werr"]["all"] == pytest.approx(0.45)
    assert e2e["werr"]["DP5"] == pytest.approx((0.5 - 0.32) / 0.5)
    md = ssl.storage.read_text(ssl.other("report", "report.md"))
    assert "| CTC SSL student (labeled + pseudo-labels) | 22.0 | 20.0-24.0 |" in md
    assert "| CTC SSL's WERR over the CTC baseline % | 45.0 |" in md
    report = json.loads(ssl.storage.read_text(ssl.other("report", "report.json")))
    tests = {t["comparison"]: t for t in report["significance"]["tests"]}
    assert tests["CTC SSL vs CTC baseline"]["significant"]
    assert tests["CTC SSL vs hybrid SSL"]["delta"] == pytest.approx(0.05)
    assert "CTC baseline vs hybrid SSL" in tests
    assert md.index("## End-to-end students") < md.index("## How sure")
