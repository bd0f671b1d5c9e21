"""model.size: the table's choice from the corpus's hours, the user's values over the size's,
one size per run, train.min_updates -> epochs, and the demo's and quickstart's configs
resolving exactly as before sizes existed (they pin model.size none)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from core.config import Config, ConfigError, TrainConfig, load_config, resolve_config
from core.config.explain import rows
from core.config.sizes import SIZES, SIZES_FILE, CorpusHours, choose, why

ROOT = Path(__file__).resolve().parents[1]
LOCAL, TINY = ROOT / "configs" / "local.yaml", ROOT / "configs" / "tiny.yaml"
DEMO_HOURS = CorpusHours(0.45, 2.1, "corpus/_SUCCESS.json")  # the demo's 27 min + 2.1 h
MODELS = (["train.model=teacher"], ["train.model=student"],
          ["train.model=student", "train.regime=ssl"], ["train.model=ctc"],
          ["train.model=ctc", "train.pseudolabels=R"])


@pytest.mark.parametrize("labeled, unlabeled, size", [
    (0.45, 2.1, "small"),      # the demo's corpus
    (0.3, 0.0, "small"),       # 300 transcribed utterances, nothing else
    (10, 100, "small"),        # the bounds hold
    (30, 2, "medium"),         # tens of transcribed hours
    (2, 500, "medium"),        # few transcribed, hundreds untranscribed: the larger decides
    (100, 1000, "medium"),
    (300, 0, "large"),
    (1, 5000, "large"),
])
def test_the_table_chooses_by_both_hours(labeled, unlabeled, size):
    assert choose(labeled, unlabeled) == size


def test_rows_are_small_medium_large_and_each_resolves_for_every_model():
    assert list(SIZES) == ["small", "medium", "large"]
    for name, row in SIZES.items():
        for sets in MODELS:
            cfg = load_config(None, [f"model.size={name}", *sets])
            assert cfg.model.size == name
            assert cfg.model.teacher.layers == row["model"]["teacher"]["layers"]
            assert cfg.model.student.hidden == row["model"]["student"]["hidden"]


def test_small_is_the_demos_recipe():
    """The small row's shapes and training are configs/local.yaml's (the demo's teacher
    and CTC presets without their example servers and thread count)."""
    for sets in MODELS:
        small = load_config(None, ["model.size=small", *sets])
        demo = load_config(LOCAL, sets)
        assert small.model.teacher == demo.model.teacher
        assert small.model.student == demo.model.student
        assert small.model.ctc == demo.model.ctc
        for key in ("epochs", "finetune_epochs", "sub_epochs", "unlabeled_passes",
                    "minibatch_frames", "lr", "final_lr", "freq_masks", "time_masks"):
            assert small.get(f"train.{key}") == demo.get(f"train.{key}"), (sets, key)


def test_auto_takes_the_row_of_the_hours_and_says_why():
    r = resolve_config(None, ["train.model=teacher"], DEMO_HOURS)
    assert r.config.model.size == "small" and r.hours == DEMO_HOURS
    assert r.source("model.size") == ("auto: 0.45 h transcribed, 2.1 h untranscribed -> small "
                                      "(corpus/_SUCCESS.json)")
    assert (r.config.model.teacher.layers, r.config.model.teacher.hidden) == (3, 256)
    assert r.source("model.teacher.hidden") == "model.size small (configs/presets/sizes.yaml)"
    # the size's teacher preset applies as a config file's does
    assert r.config.train.passes.epochs == 28 and r.config.train.passes.min_updates == 3500
    assert r.source("train.epochs").startswith("train.teacher_preset (in model.size small")
    big = resolve_config(None, [], CorpusHours(400.0, 0.0, "x"))
    assert big.config.model.size == "large" and big.config.model.student.layers == 5
    assert why(CorpusHours(30.0, 2.1, "x")) == ("auto: 30 h transcribed, 2.1 h untranscribed "
                                               "-> medium")


def test_auto_without_hours_and_none_are_the_schema_defaults():
    for sets, hours in (([], None), (["model.size=none"], DEMO_HOURS)):
        r = resolve_config(None, ["train.model=teacher", *sets], hours)
        data = r.config.to_dict()
        expected = Config().to_dict()
        expected["train"]["model"] = "teacher"
        expected["model"]["size"] = data["model"]["size"]
        assert data == expected and r.hours is None
    assert resolve_config(None).config.model.size == "auto"


def test_explicit_keys_win_over_the_size(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("model:\n  teacher: {layers: 1}\ntrain:\n  lr: 0.01\n")
    r = resolve_config(path, ["train.model=teacher", "model.student.hidden=64"], DEMO_HOURS)
    cfg = r.config
    assert cfg.model.teacher.layers == 1 and r.source("model.teacher.layers") == str(path)
    assert cfg.model.teacher.hidden == 256  # the size's, beside the file's layers
    assert cfg.model.student.hidden == 64 and r.source("model.student.hidden") == "--set"
    # the file's train.lr wins over the size's base value and its teacher preset alike
    assert cfg.train.optim.lr == 0.01 and r.source("train.lr") == str(path)
    shown = {k: s for k, _, s in rows(r)}
    assert shown["model.teacher.hidden"] == "model.size small (configs/presets/sizes.yaml)"
    assert shown["model.teacher.layers"] == str(path)
    # a section given as a mapping sets the keys it names (the others: the size's, where
    # without a size they would be the schema's)
    part = resolve_config(None, ["model.teacher={layers: 2, hidden: 32}"], DEMO_HOURS)
    assert (part.config.model.teacher.layers, part.config.model.teacher.hidden,
            part.config.model.teacher.dropout) == (2, 32, 0.3)


def test_an_epoch_count_given_turns_the_sizes_budget_off():
    """train.epochs given: the size's epochs, min_updates, finetune_epochs and its presets'
    are not laid beside it (test_own_corpus trains two epochs)."""
    r = resolve_config(None, ["train.model=teacher", "train.epochs=2"], DEMO_HOURS)
    p = r.config.train.passes
    assert (p.epochs, p.min_updates, p.finetune_epochs) == (2, 0, 1)
    assert r.config.train.teacher_preset == {"freq_masks": 2, "time_masks": 2}
    ctc = resolve_config(None, ["train.model=ctc", "train.pseudolabels=R", "train.epochs=3"],
                         DEMO_HOURS).config.train.passes
    assert (ctc.epochs, ctc.min_updates, ctc.pseudolabel_epochs) == (3, 0, 0)
    # a preset of the user's with an epoch count: the size's floor is off for it
    own = resolve_config(None, ["train.model=teacher", "train.teacher_preset={epochs: 5}"],
                         DEMO_HOURS).config.train.passes
    assert (own.epochs, own.min_updates) == (5, 0)
    # the student keeps the size's budget
    student = resolve_config(None, ["train.model=student"], DEMO_HOURS).config.train.passes
    assert (student.epochs, student.min_updates, student.finetune_epochs) == (16, 2000, 3)


@pytest.mark.parametrize("value", ["huge", "Small", 3])
def test_a_bad_size_names_the_key(tmp_path, value):
    with pytest.raises(ConfigError) as e:
        resolve_config(None, [f"model.size={value}"], DEMO_HOURS)
    assert e.value.key == "model.size" and "auto, small, medium, large, none" in str(e.value)
    path = tmp_path / "bad.yaml"
    path.write_text(f"model: {{size: {value}}}\n")
    with pytest.raises(ConfigError, match="'model.size'"):
        load_config(path)


# -- the demo's and the quickstart's configs: exactly as before model.size existed

# What configs/local.yaml and configs/tiny.yaml resolved to before model.size (at
# ba2aa5d), per model, for the keys a size row sets: written down from that commit.
BEFORE = {
    LOCAL: {"teacher": {"model.teacher.layers": 3, "model.teacher.hidden": 256,
                        "model.teacher.dropout": 0.3, "train.epochs": 28,
                        "train.finetune_epochs": 3, "train.freq_masks": 2,
                        "train.minibatch_frames": 512, "train.lr": 0.003, "train.threads": 2,
                        "train.augment.enabled": True},
            "student": {"model.student.layers": 2, "model.student.hidden": 384,
                        "model.student.dropout": 0.2, "train.epochs": 16,
                        "train.finetune_epochs": 3, "train.sub_epochs": 6,
                        "train.unlabeled_passes": 3, "train.freq_masks": 0,
                        "train.minibatch_frames": 512, "train.lr": 0.003},
            "ctc": {"model.ctc.layers": 3, "model.ctc.hidden": 256, "model.ctc.channels": [16, 16],
                    "train.epochs": 20, "train.finetune_epochs": 0,
                    "train.minibatch_frames": 1000, "train.lr": 0.002}},
    TINY: {"teacher": {"model.teacher.layers": 2, "model.teacher.hidden": 96,
                       "model.teacher.dropout": 0.1, "train.epochs": 10,
                       "train.finetune_epochs": 1, "train.freq_masks": 0,
                       "train.minibatch_frames": 256, "train.lr": 0.003, "train.threads": 1,
                       "train.augment.enabled": False},
           "student": {"model.student.layers": 1, "model.student.hidden": 96,
                       "model.student.dropout": 0.0, "train.epochs": 8,
                       "train.finetune_epochs": 1, "train.sub_epochs": 4,
                       "train.unlabeled_passes": 2, "train.freq_masks": 0,
                       "train.minibatch_frames": 256, "train.lr": 0.003},
           "ctc": {"model.ctc.layers": 1, "model.ctc.hidden": 96, "model.ctc.channels": [8, 8],
                   "train.epochs": 6, "train.finetune_epochs": 0,
                   "train.minibatch_frames": 3000, "train.lr": 0.003}},
}


@pytest.mark.parametrize("path", [LOCAL, TINY], ids=["local", "tiny"])
def test_demo_and_quickstart_resolve_as_before_sizes(path):
    for model, expected in BEFORE[path].items():
        r = resolve_config(path, [f"train.model={model}"], DEMO_HOURS)
        assert r.config.model.size == "none" and r.hours is None
        assert r.config.train.passes.min_updates == 0
        assert {k: r.config.get(k) for k in expected} == expected, model
    for sets in MODELS:
        pinned = resolve_config(path, sets).config.to_dict()
        # the corpus's hours change nothing (none), nor would the small row: the file
        # names every value it sets
        for other in (resolve_config(path, sets, DEMO_HOURS),
                      resolve_config(path, [*sets, "model.size=small"], DEMO_HOURS)):
            data = other.config.to_dict()
            data["model"]["size"] = "none"
            assert data == pinned, sets


# -- train.min_updates -> train.epochs

def _index(utts: int, rows: int, parts: int = 1):
    from training.data import SplitIndex

    return SplitIndex(uris=[f"p{i}" for i in range(parts)], target="labels",
                      part=np.arange(utts, dtype=np.int32) % parts,
                      row=np.arange(utts, dtype=np.int32) // parts,
                      frames=np.full(utts, rows, np.int64),
                      has_frame_labels=np.ones(utts, bool), utt_ids=[f"u{i}" for i in range(utts)],
                      conditions=[""] * utts, feat_dim=4)


def test_an_epoch_is_the_first_passs_minibatches_per_worker():
    from training.inputs import epoch_minibatches

    tc = TrainConfig.from_flat(chunk_frames=32, minibatch_frames=512)
    # 10 utterances of 100 rows: 4 chunks each, 16 chunks a minibatch -> 3 minibatches
    assert epoch_minibatches(tc, [_index(10, 100)], stack=3) == 3
    assert epoch_minibatches(tc, [_index(10, 100), _index(22, 100)], stack=3) == 3 + 6
    two = TrainConfig.from_flat(chunk_frames=32, minibatch_frames=512, workers=2)
    assert epoch_minibatches(two, [_index(40, 100, parts=2)], stack=3) == 5  # 10 / 2
    # a family trained on whole utterances: 5 of them (500 rows) fill a minibatch
    ctc = TrainConfig.from_flat(model="ctc", minibatch_frames=512)
    assert epoch_minibatches(ctc, [_index(10, 100)], stack=3) == 2


def test_min_updates_raises_the_epochs_of_a_small_labeled_set():
    from amflow.services.train_plan import with_min_updates

    cfg = load_config(None, ["train.epochs=16", "train.min_updates=2000"])
    raised, derived = with_min_updates(cfg, lambda: 59)
    assert raised.train.passes.epochs == 34  # ceil(2000 / 59)
    assert derived == {"min_updates": 2000, "minibatches_per_epoch": 59, "train_epochs": 16,
                       "epochs": 34}
    same, derived = with_min_updates(cfg, lambda: 500)  # 16 epochs make 8,000 updates
    assert same is cfg and derived["epochs"] == 16
    counted = []
    for sets in (["train.min_updates=0"], ["train.regime=ssl"]):  # off; ssl counts passes
        other = load_config(None, ["train.min_updates=2000", *sets])
        assert with_min_updates(other, lambda: counted.append(1) or 59) == (other, None)
    assert not counted  # nothing is counted when nothing is raised


# -- one size per run, and what the training's summary says

def _corpus(tmp_path: Path, labeled_h: float, unlabeled_h: float) -> list[str]:
    corpus = tmp_path / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    seconds = {"labeled": labeled_h * 3600, "unlabeled": unlabeled_h * 3600, "dev": 60.0}
    (corpus / "_SUCCESS.json").write_text(json.dumps({"split_seconds": seconds}))
    return [f"storage.root={tmp_path / 'store'}", f"data.corpus={corpus}",
            "select.hours=100000"]


def test_auto_reads_the_corpus_and_a_run_keeps_its_first_choice(tmp_path):
    from amflow.model_size import auto_hours, remember_size, resolve_sized, size_summary
    from amflow.run_settings import settle
    from core.storage import Storage

    sets = _corpus(tmp_path, 0.45, 2.1)
    r = resolve_sized(None, sets)
    assert r.config.model.size == "small"
    assert r.source("model.size").startswith("auto: 0.45 h transcribed, 2.1 h untranscribed "
                                             "-> small (")
    # select.hours bounds what a run can take of the corpus
    assert resolve_sized(None, [*sets, "select.hours=0.2"]).hours.labeled == 0.2
    # a run's first step records the choice ...
    resolved, _, _, _ = settle(None, None, sets, [], "r", "select", False)
    cfg, st = resolved.config, Storage(resolved.config.storage)
    remember_size(st, cfg, "r", resolved)
    record = json.loads((tmp_path / "store" / "runs" / "r" / "_size.json").read_text())
    assert record["size"] == "small" and record["labeled_hours"] == 0.45
    # ... and keeps it when the corpus grows: the teacher's run stays small, a new run not
    _corpus(tmp_path, 0.45, 500.0)
    again, _, _, _ = settle(None, None, sets, [], "r", "train", False)
    assert again.config.model.size == "small" and again.config.model.teacher.hidden == 256
    assert "_size.json" in again.source("model.size")
    assert resolve_sized(None, sets, "new").config.model.size == "medium"
    assert auto_hours(load_config(None, [*sets, "model.size=large"]), "r") is None
    summary = size_summary(st, again.config, "r")
    assert summary["size"] == "small"
    assert summary["why"] == "auto: 0.45 h transcribed, 2.1 h untranscribed -> small"
    assert summary["hours_from"].endswith("corpus/_SUCCESS.json")


def test_without_a_corpus_summary_the_runs_selection_gives_the_hours(tmp_path):
    from amflow.model_size import auto_hours

    sets = [f"storage.root={tmp_path}", f"data.corpus={tmp_path / 'corpus'}"]
    cfg = load_config(None, sets)
    assert auto_hours(cfg, "r") is None  # nothing known yet
    select = tmp_path / "runs" / "r" / "select"
    select.mkdir(parents=True)
    (select / "_SUCCESS.json").write_text(json.dumps({"metrics": {"per_split": {
        "labeled": {"hours": 0.3}, "unlabeled": {"hours": 150.0}}}}))
    hours = auto_hours(cfg, "r")
    assert (hours.labeled, hours.unlabeled) == (0.3, 150.0)
    assert hours.source.endswith("runs/r/select/_SUCCESS.json")
    # a run that trained a model with no size record (before model.size) keeps the defaults
    done = tmp_path / "runs" / "r" / "train-teacher"
    done.mkdir()
    (done / "_SUCCESS.json").write_text("{}")
    assert auto_hours(cfg, "r") is None


def test_the_trainings_summary_line_says_the_size_and_why():
    from amflow.summary_line import human_summary

    line = human_summary("train", {
        "metrics": {"dev_frame_acc": 0.7, "min_updates": {
            "min_updates": 2000, "minibatches_per_epoch": 59, "train_epochs": 16,
            "epochs": 34}},
        "counts": {"in": 5, "out": 5}, "wall_s": 3.0,
        "model_size": {"size": "small",
                       "why": "auto: 0.45 h transcribed, 2.1 h untranscribed -> small"}})
    assert line == ("amflow train: dev FA 70.0 %, 5 in, 5 out, 3.0 s; model size auto: 0.45 h "
                    "transcribed, 2.1 h untranscribed -> small; train.min_updates 2,000 / 59 "
                    "minibatches an epoch -> 34 epochs (train.epochs 16)")
    assert human_summary("decode", {"counts": {"in": 1, "out": 1}}) == "amflow decode: 1 in, 1 out"


def test_config_show_says_the_size_and_where_each_value_came_from(tmp_path, capsys,
                                                                   monkeypatch):
    from amflow.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.yaml").write_text("storage: {root: ./mine}\ndata: {corpus: ./mine/corpus}\n"
                                        "select: {hours: 100000}\ntrain: {model: teacher}\n")
    assert main(["config", "show", "--config", "mine.yaml"]) == 0
    assert "# model.size auto: the corpus's hours are not known yet" in capsys.readouterr().out
    _corpus(tmp_path / "mine", 0.3, 3.1)
    assert main(["config", "show", "--config", "mine.yaml"]) == 0
    lines = {line.split(" = ")[0]: line for line in capsys.readouterr().out.splitlines()
             if " = " in line}
    assert lines["model.size"].startswith('model.size = "small"')
    assert lines["model.size"].endswith("# auto: 0.30 h transcribed, 3.1 h untranscribed -> "
                                        "small (./mine/corpus/_SUCCESS.json)")
    assert lines["model.teacher.hidden"].endswith("# model.size small (" + str(SIZES_FILE) + ")")
    assert "# train.teacher_preset (in model.size small" in lines["train.epochs"]

def test_a_sequence_stage_is_not_raised_by_the_sizes_floor():
    r = resolve_config(None, ["train.model=student", "train.regime=sequence"], DEMO_HOURS)
    p = r.config.train.passes
    assert (p.epochs, p.min_updates) == (3, 0)  # configs/presets/sequence.yaml's 3 epochs
    assert r.source("train.min_updates").startswith("train.sequence_preset")
