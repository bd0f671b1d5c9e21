"""Where a key's effective value comes from: presets (train.* overlays), `amflow config show`,
and the config a finished step records beside its outputs."""
import json

import pytest

from amflow import cli
from core.config import ConfigError, check_override, grown_stage, phone_stage, resolve_config
from core.runs import SUCCESS, StepContext
from tests.conftest import ROOT

LOCAL = ROOT / "configs/local.yaml"
TEACHER_FILE = "configs/presets/teacher.yaml"


def test_the_teacher_preset_file_sets_the_teachers_keys_and_says_so(monkeypatch):
    monkeypatch.chdir(ROOT)
    r = resolve_config(LOCAL, ["train.model=teacher"])
    assert r.config.train.passes.epochs == 28 and r.config.train.threads == 2
    assert TEACHER_FILE in r.source("train.epochs")
    assert TEACHER_FILE in r.source("train.augment.enabled")
    assert r.source("train.lr") == str(LOCAL)
    assert r.source("train.seed") == "default"
    student = resolve_config(LOCAL, [])
    assert student.config.train.passes.epochs == 16 and student.source("train.epochs") == str(LOCAL)


def test_set_wins_over_the_preset_file_and_a_set_inside_it_keeps_the_rest():
    r = resolve_config(LOCAL, ["train.model=teacher", "train.epochs=5",
                               "train.teacher_preset.threads=1"])
    assert r.config.train.passes.epochs == 5 and r.source("train.epochs") == "--set"
    # the file's other keys are kept when one key of the preset is set
    assert r.config.train.threads == 1 and r.config.train.masking.freq_masks == 2


def test_a_preset_named_by_a_missing_file_names_the_key(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("train: {teacher_preset: presets/nope.yaml}\n")
    with pytest.raises(ConfigError) as err:
        resolve_config(cfg, [])
    assert err.value.key == "train.teacher_preset" and "nope.yaml" in str(err.value)


def test_a_preset_file_relative_to_its_config(tmp_path):
    (tmp_path / "presets").mkdir()
    (tmp_path / "presets" / "t.yaml").write_text("lr: 0.25\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("train: {teacher_preset: presets/t.yaml, lr: 0.5}\n")
    r = resolve_config(cfg, ["train.model=teacher"])
    assert r.config.train.optim.lr == 0.25 and "t.yaml" in r.source("train.lr")
    assert resolve_config(cfg, []).config.train.optim.lr == 0.5


OLD_AND_NEW = [("train.teacher_recipe", "train.teacher_preset"),
               ("train.ctc_recipe", "train.ctc_preset"),
               ("train.sequence_recipe", "train.sequence_preset"),
               ("train.grow_recipe", "train.grow_preset")]


@pytest.mark.parametrize("old,new", OLD_AND_NEW)
def test_an_old_preset_key_is_read_as_the_new_one_with_a_warning(old, new, caplog):
    """The presets were called recipes: the old keys still work, and say what to write."""
    sets = ["train.model=teacher", "train.regime=sequence"] if "sequence" in old else \
        ["train.model=ctc"] if "ctc" in old else ["train.model=teacher"]
    value = "{epochs: 9, criterion: mmi}" if "sequence" in old else "{epochs: 9}"
    with caplog.at_level("WARNING"):
        by_old = resolve_config(None, [*sets, f"{old}={value}", f"{old}.lr=0.5"])
    by_new = resolve_config(None, [*sets, f"{new}={value}", f"{new}.lr=0.5"])
    assert by_old.config.to_dict() == by_new.config.to_dict()
    assert by_old.sources == by_new.sources
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(old in m and new in m for m in warned)


def test_train_recipe_is_read_as_train_regime_with_a_warning(tmp_path, caplog):
    """train.recipe (labeled | ssl | sequence) is train.regime: "recipe" names a pipeline
    of runs now. The old key still works from --set, a config file and a from_flat call,
    and checkpoints keep its old name in their fingerprint (so they still resume)."""
    from core.config import TrainConfig
    from training.loop import fingerprint_changes, train_fingerprint

    with caplog.at_level("WARNING"):
        by_old = resolve_config(None, ["train.recipe=sequence"])
    assert any("train.recipe" in r.getMessage() and "train.regime" in r.getMessage()
               for r in caplog.records)
    by_new = resolve_config(None, ["train.regime=sequence"])
    assert by_old.config.to_dict() == by_new.config.to_dict()
    assert by_new.config.train.regime == "sequence" and by_new.source("train.lr") != "default"
    cfg = tmp_path / "c.yaml"
    cfg.write_text("train: {recipe: ssl}\n")
    assert resolve_config(cfg, []).config.train.regime == "ssl"
    assert TrainConfig.from_flat(recipe="ssl").regime == "ssl"
    fp = train_fingerprint(by_new.config.train)
    assert fp["recipe"] == "sequence" and "regime" not in fp  # the name checkpoints hold
    labeled = train_fingerprint(TrainConfig())
    assert fingerprint_changes({"train": labeled}, {"train": fp}) == ["train.criterion",
                                                                      "train.epochs",
                                                                      "train.final_lr",
                                                                      "train.finetune_epochs",
                                                                      "train.lr",
                                                                      "train.regime"]


def test_old_preset_keys_in_a_config_file_and_a_teacher_file_are_read(tmp_path, caplog):
    old = tmp_path / "old.yaml"
    old.write_text("train: {teacher_recipe: {epochs: 7, grow_recipe: {epochs: 4}},\n"
                   "        grow_recipe: {lr: 0.01}, ctc_recipe: {lr: 0.2}}\n")
    new = tmp_path / "new.yaml"
    new.write_text("train: {teacher_preset: {epochs: 7, grow_preset: {epochs: 4}},\n"
                   "        grow_preset: {lr: 0.01}, ctc_preset: {lr: 0.2}}\n")
    with caplog.at_level("WARNING"):
        a = resolve_config(old, ["train.model=teacher"]).config
    b = resolve_config(new, ["train.model=teacher"]).config
    assert a.to_dict() == b.to_dict() and a.train.grow_preset["epochs"] == 4
    assert any("train.teacher_preset.grow_recipe" in r.getMessage()
               and "train.teacher_preset.grow_preset" in r.getMessage() for r in caplog.records)
    both = tmp_path / "both.yaml"
    both.write_text("train: {teacher_recipe: {epochs: 7}, teacher_preset: {epochs: 8}}\n")
    with pytest.raises(ConfigError) as err:
        resolve_config(both, [])
    assert err.value.key == "train.teacher_recipe" and "train.teacher_preset" in str(err.value)


def test_an_old_preset_path_reads_the_moved_file_and_says_where(tmp_path, caplog):
    """configs/recipes/teacher.yaml moved to configs/presets/ (configs/recipes/ now holds
    the pipeline recipes): a config naming the old path still reads it, with a WARNING."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("train: {teacher_recipe: recipes/teacher.yaml}\n")
    with caplog.at_level("WARNING"):
        r = resolve_config(cfg, ["train.model=teacher"])
    assert r.config.train.passes.epochs == 28  # configs/presets/teacher.yaml's
    assert any("configs/presets/teacher.yaml" in r.getMessage() for r in caplog.records)
    cfg.write_text("train: {teacher_preset: recipes/nope.yaml}\n")
    with pytest.raises(ConfigError, match="presets"):
        resolve_config(cfg, [])


def test_the_form_check_accepts_an_old_preset_key():
    assert check_override("train.teacher_recipe.epochs=3") is None
    assert check_override("train.grow_recipe={epochs: 3}") is None
    assert check_override("train.grow_recipes.epochs=3") == "unknown key train.grow_recipes"


def test_the_sequence_defaults_come_from_their_file():
    r = resolve_config(None, ["train.regime=sequence"])
    assert r.config.train.optim.lr == 1.0e-4
    assert "configs/presets/sequence.yaml" in r.source("train.lr")


def test_the_grown_stage_is_resolved_in_the_config_layer():
    r = grown_stage(resolve_config(LOCAL, []))
    assert r.config.train.optim.lr == 1.0e-3 and r.config.train.phone_weight == 3.0
    assert r.source("train.lr").startswith("train.grow_preset (")
    assert r.source("train.final_lr") == str(LOCAL)


def test_the_phone_stage_is_resolved_in_the_config_layer():
    """train.grow's first stage trains without the phone term (its classes are the
    phones); the config layer says so, the library only takes the config it gets."""
    resolved = resolve_config(LOCAL, ["train.phone_weight=2"])
    r = phone_stage(resolved)
    assert r.config.train.phone_weight == 0.0 and "phone stage" in r.source("train.phone_weight")
    assert r.config.train.to_flat() == {**resolved.config.train.to_flat(), "phone_weight": 0.0}
    assert resolved.config.train.phone_weight == 2.0  # left as it was


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


def test_a_config_recorded_before_the_renames_is_shown_under_the_new_names():
    """A run's _config.json written when the keys were train.recipe and
    train.teacher_recipe still shows, under train.regime and train.teacher_preset."""
    from core.config.explain import record, rows_of_record

    r = resolve_config(LOCAL, ["train.model=teacher"])
    rec = json.loads(json.dumps(record(r, ["train"])))
    new_rows = rows_of_record(rec, everything=True)
    train = rec["config"]["train"]
    train["recipe"] = train.pop("regime")
    train["teacher_recipe"] = train.pop("teacher_preset")
    train["teacher_recipe"]["grow_recipe"] = train["teacher_recipe"].pop("grow_preset")
    rec["sources"] = {k.replace("teacher_preset", "teacher_recipe"): v
                      for k, v in rec["sources"].items()}
    assert "train.teacher_recipe" in rec["sources"]
    assert rows_of_record(rec, everything=True) == new_rows
