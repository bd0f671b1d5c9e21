"""Where a key's effective value comes from: recipes as YAML overlays, `amflow config show`,
and the config a finished step records beside its outputs."""
import json

import pytest

from amflow import cli
from core.config import ConfigError, grown_stage, resolve_config
from core.runs import SUCCESS, StepContext
from tests.conftest import ROOT

LOCAL = ROOT / "configs/local.yaml"
TEACHER_FILE = "configs/recipes/teacher.yaml"


def test_the_teacher_recipe_file_sets_the_teachers_keys_and_says_so(monkeypatch):
    monkeypatch.chdir(ROOT)
    r = resolve_config(LOCAL, ["train.model=teacher"])
    assert r.config.train.passes.epochs == 28 and r.config.train.threads == 2
    assert TEACHER_FILE in r.source("train.epochs")
    assert TEACHER_FILE in r.source("train.augment.enabled")
    assert r.source("train.lr") == str(LOCAL)
    assert r.source("train.seed") == "default"
    student = resolve_config(LOCAL, [])
    assert student.config.train.passes.epochs == 16 and student.source("train.epochs") == str(LOCAL)


def test_set_wins_over_the_recipe_file_and_a_set_inside_it_keeps_the_rest():
    r = resolve_config(LOCAL, ["train.model=teacher", "train.epochs=5",
                               "train.teacher_recipe.threads=1"])
    assert r.config.train.passes.epochs == 5 and r.source("train.epochs") == "--set"
    # the file's other keys are kept when one key of the recipe is set
    assert r.config.train.threads == 1 and r.config.train.masking.freq_masks == 2


def test_a_recipe_named_by_a_missing_file_names_the_key(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("train: {teacher_recipe: recipes/nope.yaml}\n")
    with pytest.raises(ConfigError) as err:
        resolve_config(cfg, [])
    assert err.value.key == "train.teacher_recipe" and "nope.yaml" in str(err.value)


def test_a_recipe_file_relative_to_its_config(tmp_path):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "t.yaml").write_text("lr: 0.25\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("train: {teacher_recipe: recipes/t.yaml, lr: 0.5}\n")
    r = resolve_config(cfg, ["train.model=teacher"])
    assert r.config.train.optim.lr == 0.25 and "t.yaml" in r.source("train.lr")
    assert resolve_config(cfg, []).config.train.optim.lr == 0.5


def test_the_sequence_defaults_come_from_their_file():
    r = resolve_config(None, ["train.recipe=sequence"])
    assert r.config.train.optim.lr == 1.0e-4
    assert "core/config/recipes/sequence.yaml" in r.source("train.lr")


def test_the_grown_stage_is_resolved_in_the_config_layer():
    r = grown_stage(resolve_config(LOCAL, []))
    assert r.config.train.optim.lr == 1.0e-3 and r.config.train.phone_weight == 3.0
    assert r.source("train.lr").startswith("train.grow_recipe (")
    assert r.source("train.final_lr") == str(LOCAL)


def test_config_show_prints_each_set_key_with_its_source(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert cli.main(["config", "show", "--set", "train.model=teacher",
                     "--set", "train.lr=0.01"]) == 0
    out = capsys.readouterr().out
    lines = {ln.split(" = ")[0]: ln for ln in out.splitlines() if " = " in ln}
    assert lines["train.lr"].endswith("# --set") and "0.01" in lines["train.lr"]
    assert TEACHER_FILE in lines["train.epochs"] and "28" in lines["train.epochs"]
    assert "train.seed" not in lines  # a default: shown with --all only
    assert cli.main(["config", "show", "--all", "--step", "sequence"]) == 0
    out = capsys.readouterr().out
    assert "train.seed = 0" in out and "sequence.yaml" in out


def test_a_finished_step_records_its_config_and_show_reads_it(tmp_path, capsys):
    r = resolve_config(LOCAL, [f"storage.root={tmp_path}", "train.model=teacher",
                               "train.tag=teacher"])
    ctx = StepContext(r.config, "r1", "train")
    ctx.storage.write_json(ctx.other("train-teacher", SUCCESS), {"step": "train"})
    cli._record_config(ctx, r, ["train", "--run-id", "r1"])
    rec = json.loads((tmp_path / "runs/r1/train-teacher/_config.json").read_text())
    assert rec["config"]["train"]["epochs"] == 28 and rec["argv"][0] == "train"
    assert cli.main(["config", "show", "--set", f"storage.root={tmp_path}", "--run-id", "r1",
                     "--step", "train-teacher"]) == 0
    out = capsys.readouterr().out
    assert "train.epochs = 28" in out and "teacher.yaml" in out
    assert cli.main(["config", "show", "--set", f"storage.root={tmp_path}", "--run-id", "r1",
                     "--step", "train-baseline"]) == 1
