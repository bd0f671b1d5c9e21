"""Data intervals: which metadata files an interval reads, how its partition is keyed,
what a re-run hands back (fast: select only, on the tiny corpus)."""
from __future__ import annotations

import datetime as dt
import os
import shutil

import pytest

from core.config import ConfigError, load_config
from core.runs import StepContext
from amflow.steps import select as select_step
from tasks.intervals import (Interval, IntervalError, day_runs, file_date, files_in_interval,
                             interval_run_id, window_dates)
from tests.conftest import ROOT


def _day(date: str) -> Interval:
    return Interval.parse(date, (dt.date.fromisoformat(date) + dt.timedelta(days=1)).isoformat())


def test_interval_days_labels_and_run_ids():
    day = _day("2026-03-08")
    assert day.is_day and day.dates() == ["2026-03-08"] and day.label() == "2026-03-08"
    assert interval_run_id("daily", day) == "daily-2026-03-08"
    six = Interval.parse("2026-03-08T18:00", "2026-03-09T06:00")
    assert not six.is_day and six.dates() == ["2026-03-08", "2026-03-09"]
    assert six.label() == "20260308T1800-20260309T0600"
    # a time with an offset is taken in UTC; the end is exclusive
    late = Interval.parse("2026-03-08T01:00+02:00", "2026-03-09T00:00+00:00")
    assert late.start == dt.datetime(2026, 3, 7, 23, tzinfo=dt.timezone.utc)
    assert late.contains(late.start.timestamp()) and not late.contains(late.end.timestamp())
    with pytest.raises(IntervalError, match="select.interval_end"):
        Interval.parse("2026-03-09", "2026-03-08")
    with pytest.raises(IntervalError, match="not an ISO 8601"):
        Interval.parse("yesterday", "2026-03-08")


def test_files_of_an_interval_are_its_days_and_the_unpartitioned():
    files = ["metadata/date=2026-03-07/bucket=01/part-00001.jsonl",
             "metadata/date=2026-03-08/bucket=01/part-00001.jsonl",
             "metadata/date=2026-03-08/bucket=02/part-00003.jsonl",
             "metadata/date=2026-03-09/bucket=01/part-00001.jsonl",
             "metadata/bucket=04/part-00000.jsonl", "metadata.jsonl"]
    assert file_date(files[1]) == "2026-03-08" and file_date(files[4]) is None
    assert files_in_interval(files, _day("2026-03-08")) == files[1:3] + files[4:]
    two = Interval.parse("2026-03-08T12:00", "2026-03-09T12:00")
    assert files_in_interval(files, two) == files[1:]


def test_day_runs_and_training_windows():
    runs = ["daily-2026-03-08", "daily-2026-03-10", "other-2026-03-09", "daily-x",
            "daily-20260308T1800-20260309T0600", "ssl_student__manual"]
    assert day_runs(runs, "daily") == {"2026-03-08": "daily-2026-03-08",
                                       "2026-03-10": "daily-2026-03-10"}
    assert window_dates(3, "", "", "2026-03-10") == ["2026-03-08", "2026-03-09", "2026-03-10"]
    assert window_dates(2, "", "2026-03-09", "2026-03-10") == ["2026-03-08", "2026-03-09"]
    assert window_dates(0, "2026-03-09", "2026-03-10", None) == ["2026-03-09", "2026-03-10"]
    assert window_dates(0, "", "", "2026-03-10") == []  # no window asked for
    with pytest.raises(IntervalError, match="from_date"):
        window_dates(0, "2026-03-11", "2026-03-10", None)


def test_interval_config_keys_are_checked():
    ok = load_config(None, ["select.interval_start=2026-03-08",
                            "select.interval_end=2026-03-09"])
    assert ok.select.interval_start == "2026-03-08"  # YAML's date, kept as the string
    for sets, key in ((["select.interval_start=2026-03-08"], "select.interval_end"),
                      (["select.interval_start=2026-03-09", "select.interval_end=2026-03-08"],
                       "select.interval_end"),
                      (["select.interval_start=soon", "select.interval_end=2026-03-08"],
                       "select.interval_start"),
                      (["daily.dataset=my-data"], "daily.dataset"),
                      (["repartition.from_date=3 March"], "repartition.from_date"),
                      (["repartition.days=-1"], "repartition.days"),
                      (["daily.inline_hours=-1"], "daily.inline_hours"),
                      (["ray.inline_hours=-0.5"], "ray.inline_hours")):
        with pytest.raises(ConfigError) as err:
            load_config(None, sets)
        assert key in str(err.value), (sets, err.value)


# --------------------------------------------------------------- select on the tiny corpus

@pytest.fixture()
def corpus(tiny_corpus, tmp_path):
    """A copy of the tiny corpus (tests below touch its files)."""
    out = tmp_path / "corpus"
    shutil.copytree(tiny_corpus, out)
    return out


def _days_with_data(corpus) -> list[str]:
    return sorted(p.name.split("=", 1)[1] for p in (corpus / "metadata").iterdir()
                  if any(p.rglob("*.jsonl")))


def _select(corpus, root, run_id: str, day: str, *sets: str) -> dict:
    iv = _day(day).to_json()
    cfg = load_config(ROOT / "configs" / "local.yaml", [
        f"storage.root={root}", f"data.corpus={corpus}", "select.splits=unlabeled",
        "select.hours=1000", f"select.interval_start={iv[0]}", f"select.interval_end={iv[1]}",
        *sets])
    return select_step.run(StepContext(cfg, run_id, "select"))


def test_select_reads_only_the_interval_and_is_keyed_by_its_files(corpus, tmp_path):
    days = _days_with_data(corpus)
    assert len(days) >= 3
    day, other = days[1], days[2]
    files = sorted((corpus / "metadata" / f"date={day}").rglob("*.jsonl"))
    first = _select(corpus, tmp_path / "a", "daily-" + day, day)
    assert first["inputs"]["metadata_files"] == len(files)
    assert first["inputs"]["interval"][0].startswith(day)
    m, c = first["metrics"], first["counts"]
    assert c["outside_interval"] == 0 and c["in"] == c["out"] + c["rejected"]
    assert m["interval_label"] == day and m["hours_in"] >= m["hours_wanted"] > 0
    # every manifest row was created on that day, of the unlabeled split
    import pyarrow.parquet as pq

    rows = [r for p in (tmp_path / "a" / "runs" / f"daily-{day}" / "select" / "shards").iterdir()
            for r in pq.read_table(p).to_pylist()]
    assert rows and {r["created_at"][:10] for r in rows} == {day}
    assert {r["split"] for r in rows} == {"unlabeled"}

    # another day edited: this interval's selection is handed back as it was
    other_file = next((corpus / "metadata" / f"date={other}").rglob("*.jsonl"))
    other_file.write_text(other_file.read_text() + "\n")
    again = _select(corpus, tmp_path / "a", "daily-" + day, day)
    assert again["finished_at"] == first["finished_at"] and again["started_at"] == \
        first["started_at"]
    # one of its own files rewritten (another version): selected again, under a plan that
    # names the new version (its summary can equal the first to the second on a fast run)
    plan = tmp_path / "a" / "runs" / f"daily-{day}" / "select" / "_plan.json"
    before = plan.read_text()
    st = os.stat(files[0])
    os.utime(files[0], (st.st_atime, st.st_mtime + 5))
    redone = _select(corpus, tmp_path / "a", "daily-" + day, day)
    assert plan.read_text() != before and redone["started_at"] >= first["finished_at"]


def test_an_airflow_task_hands_an_unchanged_partition_back_without_a_job(corpus, tmp_path):
    """A backfill's task of a keyed step on unchanged inputs returns the finished summary
    and starts no job (amflow.orchestration.handback); inputs that changed, rerun=redo, or
    a step that never finished start the job as before."""
    import json

    from amflow.orchestration.airflow_step import AirflowStep
    from amflow.orchestration.rerun import Attempt

    day = _days_with_data(corpus)[1]
    iv = _day(day).to_json()
    sets = ["select.splits=unlabeled", "select.hours=1000",
            f"select.interval_start={iv[0]}", f"select.interval_end={iv[1]}"]
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(json.dumps({"storage": {"root": str(tmp_path / "store")},
                               "data": {"corpus": str(corpus)},
                               "runner": {"state_dir": str(tmp_path / "jobs")}}))

    def task(step: str = "select", rerun: str = "resume", lines: list | None = None):
        return AirflowStep(step=step, dag_id="daily_data", airflow_run_id="backfill__" + day,
                           task_id=step, try_number=1, config=str(cfg), overrides=sets,
                           rerun=rerun, run_id="daily-" + day, keyed=True,
                           attempt=Attempt(backfill=True),
                           emit=(lines if lines is not None else []).append)

    assert task().hand_back() is None  # nothing finished yet: its job runs
    first = _select(corpus, tmp_path / "store", "daily-" + day, day)
    lines: list[str] = []
    kept = task(lines=lines).hand_back()
    assert kept is not None and kept.ok and kept.summary == first
    assert "handed back, no job started" in lines[-1]
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").iterdir())
    assert task(rerun="redo").hand_back() is None  # a backfill with rerun=redo forces it
    assert task(step="features").hand_back() is None  # never ran: its job runs
    # one of the interval's files rewritten: the selection is redone by its job
    f = sorted((corpus / "metadata" / f"date={day}").rglob("*.jsonl"))[0]
    os.utime(f, (f.stat().st_atime, f.stat().st_mtime + 5))
    assert task().hand_back() is None


def test_an_interval_alone_is_byte_identical_to_the_same_interval_in_a_range(corpus, tmp_path):
    """A partition depends on its interval only: selected after other days, or alone on
    another storage root, its manifests are the same bytes."""
    days = _days_with_data(corpus)[:3]
    for d in days:  # a backfill of three days
        _select(corpus, tmp_path / "range", "daily-" + d, d)
    alone = _select(corpus, tmp_path / "alone", "daily-" + days[1], days[1])
    a = tmp_path / "range" / "runs" / f"daily-{days[1]}" / "select"
    b = tmp_path / "alone" / "runs" / f"daily-{days[1]}" / "select"
    names = sorted(p.name for p in (a / "shards").iterdir())
    assert names and names == sorted(p.name for p in (b / "shards").iterdir())
    for name in names + ["../shards.json"]:
        assert (a / "shards" / name).read_bytes() == (b / "shards" / name).read_bytes(), name
    assert alone["counts"]["selected"] > 0


def test_an_empty_interval_is_an_empty_partition(corpus, tmp_path):
    days = _days_with_data(corpus)
    start = dt.date.fromisoformat(days[0])
    empty = next(d for i in range(1, 40)
                 if (d := (start + dt.timedelta(days=i)).isoformat()) not in days)
    out = _select(corpus, tmp_path, "daily-" + empty, empty)
    assert out["counts"]["selected"] == 0 and out["metrics"]["shards"] == 0
    assert out["inputs"]["metadata_files"] == 0 and out["metrics"]["hours_in"] == 0
    from amflow.steps import features as features_step

    cfg = load_config(ROOT / "configs" / "local.yaml", [f"storage.root={tmp_path}"])
    feats = features_step.run(StepContext(cfg, "daily-" + empty, "features"))
    assert feats["counts"] == {"in": 0, "out": 0, "rejected": 0}
    from amflow.steps import targets as targets_step

    # nothing to score: no teacher needed (targets.teacher names none that exists)
    cfg_t = load_config(ROOT / "configs" / "local.yaml", [f"storage.root={tmp_path}",
                                                          "targets.teacher=/nowhere/t.pt"])
    tgt = targets_step.run(StepContext(cfg_t, "daily-" + empty, "targets"))
    assert tgt["counts"] == {"in": 0, "out": 0, "rejected": 0}
    assert targets_step.run(StepContext(cfg_t, "daily-" + empty, "targets")) == tgt
    # outside an interval, a selection without shards is still an error
    (tmp_path / "runs" / "daily-x").mkdir()
    shutil.copytree(tmp_path / "runs" / f"daily-{empty}" / "select",
                    tmp_path / "runs" / "daily-x" / "select")
    succ = tmp_path / "runs" / "daily-x" / "select" / "_SUCCESS.json"
    import json

    succ.write_text(json.dumps({**json.loads(succ.read_text()), "inputs": {}}))
    from core.runs import StepError

    with pytest.raises(StepError, match="select produced no shards"):
        features_step.run(StepContext(cfg, "daily-x", "features"))


# ------------------------------------------- features and targets of an interval (real)

def _teacher(path, seed: int) -> str:
    """A tiny teacher on the features' 192 dims (its own CMVN and classes)."""
    import torch

    from core.storage import Storage
    from training.checkpoint import save_model
    from training.models import TeacherBLSTM

    torch.manual_seed(seed)
    save_model(Storage(load_config(None, []).storage), str(path), TeacherBLSTM(192, 16, 1, 10),
               cmvn={"count": 1, "sum": [0.0] * 192, "sumsq": [1.0] * 192},
               phones=[f"p{i}" for i in range(10)], features={})
    return str(path)


@pytest.mark.integration
@pytest.mark.slow
def test_interval_partition_rerun_is_handed_back_and_a_new_teacher_redoes_only_targets(
        corpus, tmp_path, ray_local):
    """features.labels=align (the demo's) on unlabeled audio alone: no align step needed."""
    import time

    from amflow.orchestration.handback import unchanged_summary
    from amflow.steps import features as features_step, targets as targets_step

    day = _days_with_data(corpus)[1]
    iv = _day(day).to_json()
    run = "daily-" + day

    def cfg(teacher: str, store: str = "store", inline: float = 0.0):
        return load_config(ROOT / "configs" / "local.yaml", [
            f"storage.root={tmp_path / store}", f"data.corpus={corpus}",
            "select.splits=unlabeled", "select.hours=1000", f"select.interval_start={iv[0]}",
            f"select.interval_end={iv[1]}", f"targets.teacher={teacher}", "targets.actors=1",
            "targets.fidelity_sample_frames=100", f"ray.inline_hours={inline}"])

    def chain(teacher: str, store: str = "store", inline: float = 0.0
              ) -> tuple[dict, dict, dict, float]:
        t0 = time.perf_counter()
        c = cfg(teacher, store, inline)
        out = (select_step.run(StepContext(c, run, "select")),
               features_step.run(StepContext(c, run, "features")),
               targets_step.run(StepContext(c, run, "targets")))
        return (*out, time.perf_counter() - t0)

    a, b = _teacher(tmp_path / "a.pt", 0), _teacher(tmp_path / "b.pt", 1)
    sel, feats, tgt, _ = chain(a)
    assert feats["counts"]["out"] == sel["counts"]["selected"] > 0
    assert not (tmp_path / "store" / "runs" / run / "features" / "phones.json").exists()
    assert tgt["counts"]["out"] == feats["counts"]["out"]
    target_files = sorted((tmp_path / "store" / "runs" / run / "targets" / "shards").iterdir())
    scored_a = [p.read_bytes() for p in target_files]
    # nothing changed: what an Airflow task asks first (amflow.orchestration.handback)
    for step, done in (("select", sel), ("features", feats), ("targets", tgt)):
        assert unchanged_summary(cfg(a), run, step) == done, step
    assert unchanged_summary(cfg(b), run, "targets") is None  # a new teacher
    assert unchanged_summary(cfg(b), run, "features") == feats
    # nothing changed: every step handed back, in seconds
    sel2, feats2, tgt2, took = chain(a)
    assert [x["finished_at"] for x in (sel2, feats2, tgt2)] == \
        [x["finished_at"] for x in (sel, feats, tgt)]
    assert took < 5, took
    # a new teacher: targets alone redone, features kept
    sel3, feats3, tgt3, _ = chain(b)
    assert sel3["finished_at"] == sel["finished_at"]
    assert feats3["finished_at"] == feats["finished_at"]
    assert tgt3["inputs"]["teacher_digest"] != tgt["inputs"]["teacher_digest"]
    assert [p.read_bytes() for p in target_files] != scored_a
    # the first teacher again: scored as the first time (byte for byte)
    chain(a)
    assert [p.read_bytes() for p in target_files] == scored_a
    # below ray.inline_hours (a small day, as daily_data runs it): no Ray task or actor,
    # the steps' own processes, and the same partition byte for byte
    _, feats_in, tgt_in, _ = chain(a, "inline", inline=1000.0)
    assert feats_in["metrics"]["executor"] == tgt_in["metrics"]["executor"] == "inline"
    assert feats["metrics"]["executor"] == "ray" and tgt_in["metrics"]["actors"][0]["inline"]
    for step in ("features", "targets"):
        ray_dir = tmp_path / "store" / "runs" / run / step
        files = sorted(p.relative_to(ray_dir) for p in ray_dir.rglob("*.parquet"))
        assert files, step
        for f in files:
            assert (tmp_path / "inline" / "runs" / run / step / f).read_bytes() == \
                (ray_dir / f).read_bytes(), (step, f)


@pytest.mark.integration
@pytest.mark.slow
def test_a_student_trains_on_a_window_of_partitions_and_its_card_names_them(
        corpus, tmp_path, ray_local):
    import json

    from amflow.steps import features as features_step, repartition as repartition_step
    from amflow.steps import targets as targets_step, train as train_step
    from training.checkpoint import load_model_card
    from core.storage import Storage

    store = tmp_path / "store"
    unlabeled_days = [p.name.split("=", 1)[1] for p in sorted((corpus / "metadata").iterdir())
                      if '"unlabeled"' in "".join(f.read_text() for f in p.rglob("*.jsonl"))]
    days = unlabeled_days[:2]
    teacher = _teacher(tmp_path / "a.pt", 0)
    for day in days:
        iv = _day(day).to_json()
        c = load_config(ROOT / "configs" / "local.yaml", [
            f"storage.root={store}", f"data.corpus={corpus}", "select.splits=unlabeled",
            f"select.interval_start={iv[0]}", f"select.interval_end={iv[1]}",
            f"targets.teacher={teacher}", "targets.actors=1",
            "targets.fidelity_sample_frames=100"])
        for step in (select_step, features_step, targets_step):
            step.run(StepContext(c, "daily-" + day, step.__name__.rsplit(".", 1)[-1]))

    cfg = load_config(ROOT / "configs" / "local.yaml", [
        f"storage.root={store}", f"data.corpus={corpus}", "features.labels=ctm",
        "select.splits=labeled,unlabeled,dev", "repartition.days=5",
        f"repartition.to_date={days[1]}", "train.workers=1", "train.model=student",
        "train.regime=ssl", "train.epochs=1"])
    sel = select_step.run(StepContext(cfg, "stu", "select"))
    assert sel["inputs"]["splits"] == ["labeled", "dev"]  # unlabeled: the window's
    feats = features_step.run(StepContext(cfg, "stu", "features"))
    rep = repartition_step.run(StepContext(cfg, "stu", "repartition"))
    window = json.loads((store / "runs" / "stu" / "repartition" / "window.json").read_text())
    assert [i["run_id"] for i in window["intervals"]] == [f"daily-{d}" for d in days]
    assert len(window["missing_days"]) == 3 and days[0] not in window["missing_days"]
    utts = sum(i["utts"] for i in window["intervals"])
    assert rep["metrics"]["splits"]["unlabeled"]["with_targets"] == utts > 0
    assert rep["metrics"]["window_intervals"] == 2
    assert len(rep["metrics"]["window_teachers"]) == 1  # one teacher scored both days
    union = json.loads((store / "runs" / "stu" / "repartition" / "cmvn.json").read_text())
    own = json.loads((store / "runs" / "stu" / "features" / "cmvn.json").read_text())
    daily = [json.loads((store / "runs" / f"daily-{d}" / "features" / "cmvn.json").read_text())
             for d in days]
    assert union["count"] == own["count"] + sum(x["count"] for x in daily)
    assert own["count"] < feats["metrics"]["rows"]  # the labeled split's (dev's aside)
    # nothing changed: handed back; a partition made again: repartitioned
    again = repartition_step.run(StepContext(cfg, "stu", "repartition"))
    assert again["finished_at"] == rep["finished_at"]

    train = train_step.run(StepContext(cfg, "stu", "train"))
    card = load_model_card(Storage(cfg.storage), train["model_uri"])[1]
    assert card.info["data_window"]["intervals"] == window["intervals"]
    assert card.cmvn["count"] == union["count"]
    assert train["inputs"]["data_window"] == [f"daily-{d}" for d in days]
