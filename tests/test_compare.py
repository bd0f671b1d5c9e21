"""amflow compare on two hand-made runs: WER, CI, delta and its significance, curves."""
import json

import pytest

from core.config import load_config
from core.storage import Storage
from amflow.services.compared_runs import load_run
from decoding import compare as C


def _rows(errs, words=10):
    return [{"utt_id": f"u{i}", "condition": "DP1" if i % 2 else "DP2", "ref": "",
             "hyp": "", "errors": e, "ref_words": words} for i, e in enumerate(errs)]


def write_run(root, run_id, decodes, model="s3://b/m.pt", curve=True):
    run = root / "runs" / run_id
    for step_dir, rows in decodes.items():
        d = run / step_dir
        d.mkdir(parents=True)
        wer = sum(r["errors"] for r in rows) / sum(r["ref_words"] for r in rows)
        (d / "result.json").write_text(json.dumps({"wer": wer, "model": model,
                                                   "per_condition": {"DP1": wer}}))
        (d / "hyps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (d / "_SUCCESS.json").write_text(json.dumps({"out": str(d / "result.json"),
                                                     "metrics": {"wer": wer}}))
    if curve:
        t = run / "train"
        t.mkdir(parents=True)
        recs = [{"kind": "dev", "unit": u, "frame_acc": 0.5 + u / 10, "loss": 1.0 - u / 10}
                for u in range(3)] + [{"kind": "train", "unit": 0, "loss": 2.0}]
        (t / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        (t / "_SUCCESS.json").write_text("{}")


@pytest.fixture
def store(tmp_path):
    cfg = load_config(None, [f"storage.root={tmp_path}"])
    return Storage(cfg.storage), str(tmp_path)


def test_compare_two_runs(store, tmp_path):
    st, root = store
    write_run(tmp_path, "base", {"decode": _rows([3] * 40), "decode-sequence": _rows([2, 3] * 20)})
    write_run(tmp_path, "new", {"decode": _rows([1] * 40), "decode-sequence": _rows([3, 2] * 20)},
              model="s3://b/new.pt")
    cmp = C.compare([load_run(st, root, "base"), load_run(st, root, "new")])
    rows = {(r["run"], r["decode"]): r for r in cmp["rows"]}
    assert rows[("base", "decode")]["wer"] == pytest.approx(0.3)
    assert "vs_base" not in rows[("base", "decode")]
    better = rows[("new", "decode")]["vs_base"]
    assert better["delta"] == pytest.approx(-0.2) and better["significant"]
    tie = rows[("new", "decode-sequence")]["vs_base"]
    assert tie["delta"] == pytest.approx(0.0) and tie["significant"] is False
    lo, hi = rows[("new", "decode")]["wer_ci95"]
    assert lo <= 0.1 <= hi
    assert cmp["curves"]["new"]["train"][2] == {"unit": 2, "frame_acc": 0.7, "loss": 0.8}
    md = C.render_markdown(cmp)
    assert "| new | decode | 10.00 |" in md and "s3://b/new.pt" in md
    assert "(n.s., p=" in md and "-20.00 (p<0.001)" in md


def test_unknown_run_is_a_clear_error(store):
    st, root = store
    with pytest.raises(FileNotFoundError, match="run 'nope'"):
        load_run(st, root, "nope")


def test_pairs_in_report():
    out = C.pairs_in_report({"baseline": _rows([3] * 30), "ssl": _rows([1] * 30),
                             "seq_ssl": _rows([1] * 30)})
    assert [p["comparison"] for p in out] == ["SSL vs baseline", "sequence vs CE: SSL"]
    assert out[0]["significant"] and out[1]["significant"] is False


def test_significance_section_for_the_report(store, tmp_path):
    st, root = store
    write_run(tmp_path, "t", {"decode-baseline": _rows([3] * 30)}, curve=False)
    write_run(tmp_path, "s", {"decode": _rows([1] * 30), "decode-sequence": _rows([1] * 30)},
              curve=False)
    res = lambda run, d: f"{root}/runs/{run}/{d}/result.json"  # noqa: E731
    md, data = C.significance_section(
        st, {"baseline": res("t", "decode-baseline"), "ssl": res("s", "decode"),
             "teacher": res("t", "decode-teacher")},
        {"ssl": res("s", "decode-sequence")})
    assert set(data["wer_ci95"]) == {"baseline", "ssl", "seq_ssl"}
    names = [t["comparison"] for t in data["tests"]]
    assert names == ["SSL vs baseline", "sequence vs CE: SSL"]
    text = "\n".join(md)
    assert "| SSL vs baseline | 30.00 -> 10.00 |" in text and "| no |" in text


def test_cli_compare(store, tmp_path, capsys):
    from amflow.cli import main

    write_run(tmp_path, "a", {"decode": _rows([3] * 40)})
    write_run(tmp_path, "b", {"decode": _rows([1] * 40)})
    assert main(["compare", "a", "b", "--set", f"storage.root={tmp_path}",
                 "--out", str(tmp_path / "c.json")]) == 0
    assert "| b | decode | 10.00 |" in capsys.readouterr().out
    assert json.loads((tmp_path / "c.json").read_text())["base"] == "a"
    assert main(["compare", "zz", "--set", f"storage.root={tmp_path}"]) == 1


def test_compare_page_html(store, tmp_path):
    from amflow.airflow_view import render_compare

    st, root = store
    write_run(tmp_path, "a", {"decode": _rows([3] * 40), "decode-sequence": _rows([2, 3] * 20)})
    write_run(tmp_path, "b", {"decode": _rows([1] * 40), "decode-sequence": _rows([3, 2] * 20)},
              model="s3://bucket/runs/b/train/model.pt")
    cmp = C.compare([load_run(st, root, "a"), load_run(st, root, "b")])
    page = render_compare(cmp, ["a", "b", "c"], ["a", "b"], "configs/local.yaml")
    # the headline table comes before the per-condition table and the curves
    assert page.index("id=headline") < page.index("per condition") < page.index("devcurves")
    assert "s3://bucket/runs/b/train/model.pt" in page
    assert "<b>n.s.</b>" in page and "class='n sig'>-20.00" in page
    assert page.count("<polyline") == 2 and "value='c'>" in page


def test_compare_pairs_by_model_kind_or_explicitly(store, tmp_path):
    """A student decoded as decode-student meets another run's baseline (decode-baseline,
    the same model kind and split); --pair names the pair when the kind is ambiguous."""
    st, root = store
    write_run(tmp_path, "base", {"decode-baseline": _rows([3] * 40),
                                 "decode-teacher": _rows([1] * 40)}, curve=False)
    write_run(tmp_path, "stu", {"decode-student": _rows([2] * 40)}, curve=False)
    for run, d, kind in (("base", "decode-baseline", "lstm"), ("base", "decode-teacher", "blstm"),
                         ("stu", "decode-student", "lstm")):
        f = tmp_path / "runs" / run / d / "result.json"
        f.write_text(json.dumps({**json.loads(f.read_text()), "model_kind": kind,
                                 "split": "test"}))
    runs = [load_run(st, root, "base"), load_run(st, root, "stu")]
    (row,) = [r for r in C.compare(runs)["rows"] if r["run"] == "stu"]
    assert (row["base_decode"], row["paired_by"]) == ("decode-baseline", "model_kind")
    assert row["vs_base"]["delta"] == pytest.approx(-0.1)
    assert "vs decode-baseline" in C.render_markdown(C.compare(runs))
    (row,) = [r for r in C.compare(runs, pairs={"decode-student": "decode-teacher"})["rows"]
              if r["run"] == "stu"]
    assert row["paired_by"] == "pair" and row["vs_base"]["delta"] == pytest.approx(0.1)
    with pytest.raises(FileNotFoundError, match="no decode-nope"):
        C.compare(runs, pairs={"decode-student": "decode-nope"})


def test_compare_across_kinds_a_ctc_student_against_the_hybrid_one(store, tmp_path, capsys):
    """One run holds the hybrid SSL student (decode) and the CTC students (decode-ctc,
    decode-ctc-baseline): --pair tests two of its own decodes of different kinds; against
    another run, a CTC decode meets the base's CTC decode by kind, never a hybrid one."""
    from amflow.cli import main

    st, root = store
    write_run(tmp_path, "ssl", {"decode": _rows([2] * 40), "decode-ctc": _rows([3] * 40),
                                "decode-ctc-baseline": _rows([5] * 40)}, curve=False)
    write_run(tmp_path, "other", {"decode-ctc2": _rows([4] * 40)}, curve=False)
    for run, d, kind, search in (("ssl", "decode", "lstm", None),
                                 ("ssl", "decode-ctc", "ctc", "tlg"),
                                 ("ssl", "decode-ctc-baseline", "ctc", "tlg"),
                                 ("other", "decode-ctc2", "ctc", "tlg")):
        f = tmp_path / "runs" / run / d / "result.json"
        f.write_text(json.dumps({**json.loads(f.read_text()), "model_kind": kind,
                                 "split": "test", "search": search}))
    cmp = C.compare([load_run(st, root, "ssl")], pairs={"decode-ctc": "decode"})
    rows = {r["decode"]: r for r in cmp["rows"]}
    assert rows["decode-ctc"]["vs_base"]["delta"] == pytest.approx(0.1)
    assert rows["decode-ctc"]["vs_base"]["significant"]
    assert rows["decode-ctc"]["model_kind"] == "ctc" and rows["decode"]["model_kind"] == "lstm"
    assert "vs_base" not in rows["decode"] and "vs_base" not in rows["decode-ctc-baseline"]
    # by kind: two CTC decodes in the base, so none is chosen without --pair
    two = C.compare([load_run(st, root, "ssl"), load_run(st, root, "other")])
    (row,) = [r for r in two["rows"] if r["run"] == "other"]
    assert "vs_base" not in row
    assert main(["compare", "ssl", "other", "--set", f"storage.root={tmp_path}",
                 "--pair", "decode-ctc2=decode"]) == 0
    out = capsys.readouterr().out
    assert "| other | decode-ctc2 | 40.00 |" in out and "+20.00 (p<0.001) vs decode |" in out
    assert "(ctc)" in out and "(lstm)" in out
