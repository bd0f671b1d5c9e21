import subprocess

import pytest

from amflow.config import ConfigError, load_config
from tests.conftest import ROOT, amflow_bin


def test_local_and_aws_profiles_load():
    local = load_config(ROOT / "configs/local.yaml")
    aws = load_config(ROOT / "configs/aws.yaml")
    assert local.storage.root == "./data" and local.ray.address == ""
    assert aws.storage.root.startswith("s3://")
    assert (aws.model.student.layers, aws.model.student.hidden) == (5, 768)
    assert (aws.model.teacher.layers, aws.model.teacher.hidden) == (5, 768)
    assert aws.features.num_mel_bins == 64 and aws.targets.k == 20


def test_override_types_and_nesting():
    cfg = load_config(ROOT / "configs/local.yaml",
                      ["select.hours=2.5", "train.workers=4", "ray.address=auto",
                       "corpus.conditions=DP1,DP3", "storage.s3.force_path_style=true"])
    assert cfg.select.hours == 2.5 and cfg.train.workers == 4 and cfg.ray.address == "auto"
    assert cfg.corpus.conditions == ["DP1", "DP3"] and cfg.storage.s3.force_path_style is True


@pytest.mark.parametrize("override,key", [
    ("storage.root=", "storage.root"),
    ("corpus.hours=-1", "corpus.hours"),
    ("corpus.nonsense=3", "corpus.nonsense"),
    ("nosuchsection.x=1", "nosuchsection"),
    ("train.workers=many", "train.workers"),
    ("train.algorithm=adamw", "train.algorithm"),
    ("ray.num_cpus=0", "ray.num_cpus"),
    ("train.criterion=smbr2", "train.criterion"),
    ("train.sequence_numerator=lattice", "train.sequence_numerator"),
    ("train.leaky_hmm=1.0", "train.leaky_hmm"),
    ("train.den_ngram_order=1", "train.den_ngram_order"),
    ("train.sequence_ce_weight=-0.1", "train.sequence_ce_weight"),
])
def test_bad_values_name_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        load_config(ROOT / "configs/local.yaml", [override])
    assert err.value.key == key
    assert f"'{key}'" in str(err.value)


def test_exponent_numbers_without_a_dot_are_numbers():
    cfg = load_config(None, ["train.lr=3e-4", "train.final_lr=1E-5"])
    assert (cfg.train.lr, cfg.train.final_lr) == (3e-4, 1e-5)
    with pytest.raises(ConfigError, match="must be a number"):
        load_config(None, ["train.lr=fast"])


def test_criterion_defaults_to_ce_and_takes_the_sequence_knobs():
    assert load_config(ROOT / "configs/local.yaml").train.criterion == "ce"
    cfg = load_config(None, ["train.recipe=sequence", "train.criterion=mmi",
                             "train.den_ngram_order=3", "train.sequence_numerator=flexible",
                             "train.leaky_hmm=0"])
    assert (cfg.train.criterion, cfg.train.den_ngram_order) == ("mmi", 3)
    assert (cfg.train.sequence_numerator, cfg.train.leaky_hmm) == ("flexible", 0.0)
    seq = load_config(None, ["train.recipe=sequence"]).train
    assert (seq.criterion, seq.epochs, seq.finetune_epochs) == ("smbr", 3, 3)


@pytest.mark.parametrize("sets", [["train.criterion=smbr"],
                                  ["train.recipe=sequence", "train.criterion=ce"],
                                  ["train.recipe=ssl", "train.criterion=mmi"]])
def test_a_sequence_criterion_belongs_to_the_sequence_recipe(sets):
    with pytest.raises(ConfigError) as err:
        load_config(None, sets)
    assert err.value.key == "train.criterion" and "sequence recipe" in str(err.value)


def test_sequence_recipe_wins_over_the_teacher_recipe_and_set_wins_over_both():
    sets = ["train.teacher_recipe={epochs: 21, lr: 0.01}", "train.model=teacher"]
    assert load_config(None, sets).train.epochs == 21
    seq = load_config(None, [*sets, "train.recipe=sequence",
                             "train.sequence_recipe={epochs: 2, criterion: mmi}"]).train
    assert (seq.epochs, seq.criterion, seq.lr) == (2, "mmi", 0.01)
    assert load_config(None, [*sets, "train.recipe=sequence", "train.epochs=4"]).train.epochs == 4
    with pytest.raises(ConfigError) as err:
        load_config(None, ["train.sequence_recipe={recipe: ssl}"])
    assert err.value.key == "train.sequence_recipe.recipe"


def test_teacher_recipe_applies_to_the_teacher_only_and_set_wins():
    recipe = "train.teacher_recipe={epochs: 21, freq_masks: 2}"
    student = load_config(None, [recipe, "train.epochs=5"])
    assert (student.train.epochs, student.train.freq_masks) == (5, 0)
    teacher = load_config(None, [recipe, "train.epochs=5", "train.model=teacher"])
    assert (teacher.train.epochs, teacher.train.freq_masks) == (5, 2)
    assert load_config(None, [recipe, "train.model=teacher"]).train.epochs == 21
    for bad, key in (("{epochz: 3}", "train.teacher_recipe.epochz"),
                     ("{epochs: many}", "train.teacher_recipe.epochs"),
                     ("{model: student}", "train.teacher_recipe.model")):
        with pytest.raises(ConfigError) as err:
            load_config(None, [f"train.teacher_recipe={bad}"])
        assert err.value.key == key


def test_cli_fails_fast_naming_the_key(tmp_path):
    for override, key in [("storage.root=", "storage.root"), ("corpus.hours=-1", "corpus.hours"),
                          ("corpus.bogus=1", "corpus.bogus")]:
        proc = subprocess.run(
            f"{amflow_bin()} corpus --config configs/local.yaml --out {tmp_path}/c --set {override}",
            shell=True, cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert key in proc.stderr


def test_every_step_help_says_what_it_reads_and_writes():
    proc = subprocess.run(f"{amflow_bin()} --help", shell=True, cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0
    for step in ["corpus", "select", "features", "targets", "repartition", "train", "evaluate",
                 "simulate", "bench"]:
        assert step in proc.stdout
        sub = subprocess.run(f"{amflow_bin()} {step} --help", shell=True, cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
        assert sub.returncode == 0 and "reads:" in sub.stdout and "writes:" in sub.stdout
