"""A run remembers its settings (amflow.run_settings): the first step records the config and
the run-wide sets; later steps start from them; a change a finished step read is refused
(naming the key and the step) unless --force, which writes it into the run's history."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from amflow.run_settings import RUN_RECORD, RunSettings, settle
from core.config import ConfigError, resolve_config
from core.config.explain import CONFIG_RECORD, record
from tests.conftest import ROOT

CONFIG = str(ROOT / "configs" / "tiny.yaml")


def _finish(store: Path, run: str, folder: str, sets: list[str]) -> None:
    """A finished step as the CLI leaves it: _SUCCESS.json and its recorded config."""
    d = store / "runs" / run / folder
    d.mkdir(parents=True, exist_ok=True)
    (d / "_SUCCESS.json").write_text(json.dumps({"step": folder}))
    resolved = resolve_config(CONFIG, sets)
    (d / CONFIG_RECORD).write_text(json.dumps(record(resolved, []), default=str))


def _start(store: Path, run: str, step: str, sets: list[str], config: str | None = CONFIG,
           force: bool = False):
    resolved, settings, forced, path = settle(config, None, [f"storage.root={store}", *sets],
                                              [], run, step, force)
    from core.runs import step_dir_of

    settings.remember(path, [f"storage.root={store}", *sets], step, forced,
                      step_dir_of(step, resolved.config))
    return resolved, settings, forced


def test_the_first_step_records_the_config_and_the_run_wide_sets(tmp_path):
    store = tmp_path / "store"
    _start(store, "r", "select", ["features.num_mel_bins=40", "select.hours=0.5",
                                  "train.tag=teacher"])
    rec = json.loads((store / "runs" / "r" / RUN_RECORD).read_text())
    assert rec["config"] == CONFIG and rec["first_step"] == "select"
    # train.tag names which model a step works on, select.hours is select's own (its
    # _config.json): neither is a setting of the run
    assert rec["sets"] == [f"storage.root={store}", "features.num_mel_bins=40"]


def test_run_id_alone_is_enough_after_the_first_step(tmp_path):
    store = tmp_path / "store"
    _start(store, "r", "select", ["lm.order=4", "features.num_mel_bins=40"])
    resolved, _, _ = _start(store, "r", "features", [], config=None)
    assert resolved.config.lm.order == 4
    assert resolved.config.features.num_mel_bins == 40
    assert resolved.config.storage.root == str(store)


def test_a_change_a_finished_step_read_is_refused_naming_key_and_step(tmp_path):
    store = tmp_path / "store"
    _start(store, "r", "select", ["select.hours=0.5"])
    _finish(store, "r", "select", [f"storage.root={store}", "select.hours=0.5"])
    with pytest.raises(ConfigError) as err:
        _start(store, "r", "features", ["select.hours=2"], config=None)
    msg = str(err.value)
    assert "select.hours" in msg and "'select'" in msg and "0.5" in msg and "--force" in msg
    # a key the finished step did not read is a new setting of the run, not a conflict
    resolved, _, _ = _start(store, "r", "features", ["decode.beam=20"], config=None)
    assert resolved.config.decode.beam == 20
    rec = json.loads((store / "runs" / "r" / RUN_RECORD).read_text())
    assert "decode.beam=20" in rec["sets"]


def test_force_records_the_change_in_the_history(tmp_path):
    store = tmp_path / "store"
    _start(store, "r", "select", ["select.hours=0.5"])
    _finish(store, "r", "select", [f"storage.root={store}", "select.hours=0.5"])
    resolved, _, forced = _start(store, "r", "select", ["select.hours=2"], config=None,
                                 force=True)
    assert resolved.config.select.hours == 2 and [c.key for c in forced] == ["select.hours"]
    rec = json.loads((store / "runs" / "r" / RUN_RECORD).read_text())
    assert rec["history"][-1]["changed"] == {"select.hours": [0.5, 2.0]}
    assert rec["history"][-1]["step"] == "select" and rec["history"][-1]["forced"]


def test_sibling_models_of_a_run_have_their_own_settings(tmp_path):
    """train-baseline beside a finished train-teacher: another model, not a changed input."""
    store = tmp_path / "store"
    teacher = ["train.model=teacher", "train.tag=teacher"]
    _start(store, "r", "train", teacher)
    _finish(store, "r", "train-teacher", [f"storage.root={store}", *teacher])
    resolved, _, _ = _start(store, "r", "train", ["train.model=student", "train.tag=baseline",
                                                  "train.lr=0.01"], config=None)
    assert resolved.config.get("train.lr") == 0.01
    rec = json.loads((store / "runs" / "r" / RUN_RECORD).read_text())
    assert not any(s.startswith("train.") for s in rec["sets"])  # the baseline's own
    # ...but the same model again with another learning rate is a changed input
    with pytest.raises(ConfigError, match="train-teacher"):
        _start(store, "r", "train", [*teacher, "train.lr=0.5"], config=None)


def test_another_config_file_is_compared_like_sets(tmp_path):
    store = tmp_path / "store"
    _start(store, "r", "select", [])
    _finish(store, "r", "select", [f"storage.root={store}"])
    other = tmp_path / "other.yaml"
    other.write_text(Path(CONFIG).read_text().replace("hours: 1.0 ", "hours: 3.0 "))
    with pytest.raises(ConfigError, match="select.hours"):
        _start(store, "r", "features", [], config=str(other))


def test_config_show_prints_the_runs_settings(tmp_path, capsys):
    from amflow.cli import main

    store = tmp_path / "store"
    _start(store, "r", "select", ["features.num_mel_bins=40"])
    assert main(["config", "show", "--config", CONFIG, "--run-id", "r",
                 "--set", f"storage.root={store}"]) == 0
    out = capsys.readouterr().out
    assert RUN_RECORD in out and "features.num_mel_bins = 40" in out


def test_settings_open_on_a_new_run_is_empty(tmp_path):
    cfg = resolve_config(CONFIG, [f"storage.root={tmp_path}"]).config
    assert not RunSettings.open(cfg, "new").known


def test_a_command_naming_no_model_works_on_the_runs_first_model(tmp_path):
    store = tmp_path / "store"
    _start(store, "r", "select", ["train.model=student", "train.regime=ssl"])
    resolved, _, _ = _start(store, "r", "decode", [], config=None)
    assert resolved.config.get("train.model") == "student"
    assert resolved.config.get("train.regime") == "ssl"
    # naming a model replaces the run's first model whole
    resolved, _, _ = _start(store, "r", "decode", ["train.model=ctc"], config=None)
    assert resolved.config.get("train.model") == "ctc"
    assert resolved.config.get("train.regime") == \
        resolve_config(CONFIG, []).config.get("train.regime")


def test_amflow_config_names_the_default_config(tmp_path, monkeypatch, capsys):
    """AMFLOW_CONFIG: a command without --config reads it (and so finds the run under its
    storage.root, with the run's remembered settings)."""
    from amflow.cli import main

    store = tmp_path / "store"
    mine = tmp_path / "mine.yaml"
    mine.write_text(f"storage:\n  root: {store}\nselect:\n  hours: 0.25\n")
    monkeypatch.setenv("AMFLOW_CONFIG", str(mine))
    _start(store, "r", "select", ["features.num_mel_bins=40"], config=str(mine))
    assert main(["config", "show", "--run-id", "r"]) == 0
    out = capsys.readouterr().out
    assert "features.num_mel_bins = 40" in out and "select.hours = 0.25" in out


def test_a_steps_own_set_is_not_the_runs(tmp_path):
    """evaluate --set evaluate.baseline=M, then evaluate without it: no baseline (the
    step's own key stays in its _config.json, the run does not impose it)."""
    store = tmp_path / "store"
    _start(store, "r", "evaluate", ["evaluate.baseline=/m.pt"])
    resolved, _, _ = _start(store, "r", "evaluate", [], config=None)
    assert not resolved.config.evaluate.baseline


def test_an_intervals_run_takes_a_new_teacher_a_plain_run_refuses_it(tmp_path):
    """daily_data reprocesses an interval's partition after a new teacher: its targets are
    keyed by the teacher's digest and redo what changed, so the new value is no conflict
    there. The same change in a run that is not an interval's is refused."""
    store = tmp_path / "store"
    day = ["select.interval_start=2026-03-03T00:00:00", "select.interval_end=2026-03-04T00:00:00"]
    _start(store, "daily", "select", [*day, "targets.teacher=/m/a.pt"])
    _finish(store, "daily", "targets", [f"storage.root={store}", *day, "targets.teacher=/m/a.pt"])
    resolved, _, forced = _start(store, "daily", "select", [*day, "targets.teacher=/m/b.pt"],
                                 config=None)
    assert resolved.config.targets.teacher == "/m/b.pt" and not forced
    _start(store, "plain", "select", ["targets.teacher=/m/a.pt"])
    _finish(store, "plain", "targets", [f"storage.root={store}", "targets.teacher=/m/a.pt"])
    with pytest.raises(ConfigError, match="targets.teacher"):
        _start(store, "plain", "select", ["targets.teacher=/m/b.pt"], config=None)


def test_a_command_naming_its_model_does_not_take_the_runs_first_models_keys(tmp_path):
    """`amflow export --run-id demo-teacher --model train-baseline`: the baseline, not the
    teacher's decode.tag (which put the baseline's export in export-teacher/)."""
    store = tmp_path / "store"
    teacher = ["train.model=teacher", "train.tag=teacher", "decode.tag=teacher"]
    _start(store, "r", "select", teacher)
    root = [f"storage.root={store}"]
    resolved, _, _, _ = settle(None, None, root, [], "r", "export", False, names_model=True)
    assert resolved.config.decode.tag == "" and resolved.config.train.model == "student"
    resolved, _, _, _ = settle(None, None, root, [], "r", "export", False)
    assert resolved.config.decode.tag == "teacher"
