import subprocess

import pytest

from core.config import ConfigError, load_config
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
    ("train.lr=abc", "train.lr"),
    ("train.lr=0", "train.lr"),
    ("train.gtc_warmup=soon", "train.gtc_warmup"),
    ("train.checkpoint_every=0", "train.checkpoint_every"),
    ("train.optim.lr=0.1", "train.optim"),  # sections are internal: not a user key
    ("train.augment.servers=-1", "train.augment.servers"),
    ("bench.workers=0", "bench.workers"),
    ("bench.lr_rule=cubic", "bench.lr_rule"),
    ("bench.gtc_steps=many", "bench.gtc_steps"),
    ("targets.fp16=maybe", "targets.fp16"),
    ("targets.fp16=1", "targets.fp16"),
    ("targets.mass=0", "targets.mass"),
    ("targets.mass=1.5", "targets.mass"),
    ("targets.codec=int8", "targets.codec"),
    ("targets.codec=sqrt1", "targets.codec"),
    ("targets.codec=sqrt256", "targets.codec"),
    ("targets.zstd_level=0", "targets.zstd_level"),
    ("targets.temperature=2", "targets.temperature"),  # not applied: train.temperature is
    ("train.phone_weight=-1", "train.phone_weight"),
])
def test_bad_values_name_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        load_config(ROOT / "configs/local.yaml", [override])
    assert err.value.key == key
    assert f"'{key}'" in str(err.value)


def test_the_class_count_has_one_source_the_tree():
    """features.labels=align: the network's classes are the leaves of its tree, which counts
    them; a model.num_classes saying it again is refused at load (it once had to be kept in
    step with align.nn_senones by hand, and a mismatch failed at train after the GMMs)."""
    aws = ROOT / "configs/aws.yaml"
    assert load_config(aws).model.num_classes == 0
    for sets in (["model.num_classes=3183"], ["model.num_classes=3183",
                                               "targets.teacher=s3://b/t/model.pt"]):
        with pytest.raises(ConfigError, match=r"the tree counts them") as err:
            load_config(aws, sets)
        assert err.value.key == "model.num_classes"
    assert load_config(aws, ["features.labels=ctm", "model.num_classes=100"])


def test_phone_weight_is_refused_by_the_sequence_recipe():
    with pytest.raises(ConfigError) as err:
        load_config(ROOT / "configs/local.yaml", ["train.regime=sequence", "train.phone_weight=1"])
    assert err.value.key == "train.phone_weight" and "sequence_preset" in str(err.value)


def test_every_flat_train_key_lives_in_one_section_and_round_trips(tmp_path):
    from core.config import TRAIN_KEYS, TrainConfig, config_to_yaml, replace_train

    cfg = load_config(ROOT / "configs/local.yaml", ["train.gtc_tau=0.5", "train.log_every=3"])
    flat = cfg.to_dict()["train"]
    assert set(flat) == set(TRAIN_KEYS) and len(flat) == 83  # 75th: train.pseudolabels, 76th: ctc_preset, 77th: pseudolabel_epochs, 78th-80th: sequence_select(_utts), sequence_kd_weight, 81st: min_updates, 82nd: sequence_select_alpha, 83rd: conformer_ctc_preset
    assert (cfg.train.algo.gtc_tau, cfg.train.checkpoints.log_every) == (0.5, 3)
    assert cfg.get("train.gtc_tau") == 0.5
    assert cfg.get("train.augment.servers") == cfg.train.augment.servers
    # The user-facing mapping (flat train keys) loads back to the same config.
    path = tmp_path / "again.yaml"
    path.write_text(config_to_yaml(cfg))
    assert "  lr: " in path.read_text() and "  optim:" not in path.read_text()
    assert load_config(path).to_dict() == cfg.to_dict()
    assert TrainConfig.from_flat(lr=0.5, criterion="mmi").optim.lr == 0.5
    tc = TrainConfig()
    assert replace_train(tc, temperature=2.0).distill.temperature == 2.0
    assert tc.distill.temperature == 1.0  # the original is left alone


def test_every_user_key_is_settable_by_its_own_name():
    import yaml

    from core.config import user_keys

    keys = dict(user_keys())
    assert "train.lr" in keys and "train.gtc_tau" in keys and "train.augment.servers" in keys
    assert not any(k.startswith(("train.optim.", "train.algo.", "train.passes.")) for k in keys)
    assert keys["runner.env"] and keys["train.teacher_preset"] and not keys["train.lr"]
    cfg = load_config(None)
    sets = []
    for key, mapping in keys.items():
        if not mapping:
            value = yaml.safe_dump(cfg.get(key), default_flow_style=True).strip()
            sets.append(f"{key}={value.removesuffix('...').strip()}")
    assert load_config(None, sets).to_dict() == cfg.to_dict()


def test_bench_keys_are_validated_config():
    cfg = load_config(None, ["bench.workers=2,4", "bench.algos=gtc,ma+ng", "bench.keep_sync=true",
                             "bench.seconds=30"])
    assert cfg.bench.workers == [2, 4] and cfg.bench.algos == ["gtc", "ma+ng"]
    assert cfg.bench.keep_sync is True and cfg.bench.seconds == 30.0
    assert load_config(None).bench.lr_rule == "tuned"


def test_exponent_numbers_without_a_dot_are_numbers():
    cfg = load_config(None, ["train.lr=3e-4", "train.final_lr=1E-5"])
    assert (cfg.train.optim.lr, cfg.train.optim.final_lr) == (3e-4, 1e-5)
    with pytest.raises(ConfigError, match="must be a number"):
        load_config(None, ["train.lr=fast"])


def test_criterion_defaults_to_ce_and_takes_the_sequence_knobs():
    assert load_config(ROOT / "configs/local.yaml").train.sequence.criterion == "ce"
    cfg = load_config(None, ["train.regime=sequence", "train.criterion=mmi",
                             "train.den_ngram_order=3", "train.sequence_numerator=flexible",
                             "train.leaky_hmm=0"])
    assert (cfg.train.sequence.criterion, cfg.train.sequence.den_ngram_order) == ("mmi", 3)
    assert (cfg.get("train.sequence_numerator"), cfg.get("train.leaky_hmm")) == ("flexible", 0.0)
    seq = load_config(None, ["train.regime=sequence"]).train.to_flat()
    assert (seq["criterion"], seq["epochs"], seq["finetune_epochs"]) == ("smbr", 3, 3)


@pytest.mark.parametrize("sets", [["train.criterion=smbr"],
                                  ["train.regime=sequence", "train.criterion=ce"],
                                  ["train.regime=ssl", "train.criterion=mmi"]])
def test_a_sequence_criterion_belongs_to_the_sequence_preset(sets):
    with pytest.raises(ConfigError) as err:
        load_config(None, sets)
    assert err.value.key == "train.criterion" and "sequence regime" in str(err.value)


def test_sequence_preset_wins_over_the_teacher_preset_and_set_wins_over_both():
    sets = ["train.teacher_preset={epochs: 21, lr: 0.01}", "train.model=teacher"]
    assert load_config(None, sets).train.passes.epochs == 21
    seq = load_config(None, [*sets, "train.regime=sequence",
                             "train.sequence_preset={epochs: 2, criterion: mmi}"]).train.to_flat()
    assert (seq["epochs"], seq["criterion"], seq["lr"]) == (2, "mmi", 0.01)
    cfg = load_config(None, [*sets, "train.regime=sequence", "train.epochs=4"])
    assert cfg.get("train.epochs") == 4
    with pytest.raises(ConfigError) as err:
        load_config(None, ["train.sequence_preset={regime: ssl}"])
    assert err.value.key == "train.sequence_preset.regime"


def test_a_recipe_mapping_merges_with_set_keys_inside_it():
    """local.yaml's teacher recipe turns the example servers on; `--set
    train.augment.enabled=false` still turns them off, and the sequence recipe reads the
    stored rendering."""
    local = ROOT / "configs/local.yaml"
    on = load_config(local, ["train.model=teacher"]).train.augment
    assert on.enabled and on.servers == 1
    off = load_config(local, ["train.model=teacher", "train.augment.enabled=false"]).train.augment
    assert not off.enabled and off.stored_prob == on.stored_prob
    more = load_config(local, ["train.model=teacher", "train.augment.servers=2"]).train.augment
    assert more.enabled and more.servers == 2
    assert not load_config(local, ["train.model=student"]).train.augment.enabled
    seq = load_config(local, ["train.model=teacher", "train.regime=sequence"])
    assert not seq.train.augment.enabled


def test_teacher_preset_applies_to_the_teacher_only_and_set_wins():
    recipe = "train.teacher_preset={epochs: 21, freq_masks: 2}"
    student = load_config(None, [recipe, "train.epochs=5"])
    assert (student.train.passes.epochs, student.train.masking.freq_masks) == (5, 0)
    teacher = load_config(None, [recipe, "train.epochs=5", "train.model=teacher"])
    assert (teacher.train.passes.epochs, teacher.train.masking.freq_masks) == (5, 2)
    assert load_config(None, [recipe, "train.model=teacher"]).train.passes.epochs == 21
    for bad, key in (("{epochz: 3}", "train.teacher_preset.epochz"),
                     ("{epochs: many}", "train.teacher_preset.epochs"),
                     ("{model: student}", "train.teacher_preset.model")):
        with pytest.raises(ConfigError) as err:
            load_config(None, [f"train.teacher_preset={bad}"])
        assert err.value.key == key


def test_ctc_preset_applies_to_the_ctc_student_only_and_set_wins():
    recipe = "train.ctc_preset={epochs: 21, sortagrad: true, lr: 0.002}"
    student = load_config(None, [recipe, "train.epochs=5"])
    assert (student.train.passes.epochs, student.train.passes.sortagrad) == (5, False)
    ctc = load_config(None, [recipe, "train.epochs=5", "train.model=ctc"])
    assert (ctc.train.passes.epochs, ctc.train.passes.sortagrad, ctc.train.optim.lr) == (
        5, True, 0.002)
    assert load_config(None, [recipe, "train.model=ctc"]).train.passes.epochs == 21
    teacher = load_config(None, [recipe, "train.model=teacher"])
    assert teacher.train.passes.epochs != 21
    # the Conformer's CTC head trains like the GRU CTC student; its hybrid head does not
    assert load_config(None, [recipe, "train.model=conformer_ctc"]).train.passes.epochs == 21
    assert load_config(None, [recipe, "train.model=conformer"]).train.passes.epochs != 21
    for bad, key in (("{epochz: 3}", "train.ctc_preset.epochz"),
                     ("{model: student}", "train.ctc_preset.model")):
        with pytest.raises(ConfigError) as err:
            load_config(None, [f"train.ctc_preset={bad}"])
        assert err.value.key == key
    # the demo's: configs/local.yaml names configs/presets/ctc.yaml
    local = load_config(ROOT / "configs" / "local.yaml", ["train.model=ctc"])
    assert local.train.ctc_preset and local.train.threads == local.train.ctc_preset["threads"]


def test_pseudolabel_epochs_are_the_ctc_ssl_students_and_set_epochs_wins():
    from core.config.loading import resolve_config

    base = ["train.model=ctc", "train.ctc_preset={epochs: 20, pseudolabel_epochs: 14}"]
    assert load_config(None, base).train.passes.epochs == 20  # the CTC baseline
    ssl = [*base, "train.pseudolabels=r1"]
    resolved = resolve_config(None, ssl)
    assert resolved.config.train.passes.epochs == 14
    assert resolved.source("train.epochs").startswith("train.pseudolabel_epochs")
    conformer = [*ssl[:-1], "train.model=conformer_ctc", "train.pseudolabels=r1"]
    assert load_config(None, conformer).train.passes.epochs == 14
    assert load_config(None, [*ssl, "train.epochs=5"]).train.passes.epochs == 5
    # 0 (the default) leaves the recipe's train.epochs alone; the hybrid student ignores it
    assert load_config(None, ["train.model=ctc", "train.ctc_preset={epochs: 7}",
                              "train.pseudolabels=r1"]).train.passes.epochs == 7
    assert load_config(None, ["train.pseudolabel_epochs=3"]).train.passes.epochs == \
        load_config(None, []).train.passes.epochs
    with pytest.raises(ConfigError) as err:
        load_config(None, ["train.pseudolabel_epochs=-1"])
    assert err.value.key == "train.pseudolabel_epochs"
    local = load_config(ROOT / "configs" / "local.yaml", ["train.model=ctc", "train.pseudolabels=r1"])
    assert local.train.passes.epochs < load_config(
        ROOT / "configs" / "local.yaml", ["train.model=ctc"]).train.passes.epochs


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


def test_the_teacher_preset_may_set_its_own_grown_stage_over_the_shared_one():
    recipe = "train.teacher_preset={epochs: 21, grow_preset: {epochs: 20}}"
    shared = load_config(None, [recipe, "train.grow_preset.lr=0.002"]).train.grow_preset
    assert (shared["epochs"], shared["lr"]) == (10, 0.002)  # the students keep the shared one
    teacher = load_config(None, [recipe, "train.grow_preset.lr=0.002", "train.model=teacher"])
    assert teacher.train.grow_preset == {**shared, "epochs": 20}  # over the shared values
    assert teacher.train.passes.epochs == 21
    mine = load_config(None, [recipe, "train.grow_preset.epochs=3", "train.model=teacher"])
    assert mine.train.grow_preset["epochs"] == 3  # an explicit --set still wins
    for bad, key in (("{grow_preset: {epochz: 3}}", "train.teacher_preset.grow_preset.epochz"),
                     ("{grow_preset: {tag: x}}", "train.teacher_preset.grow_preset.tag"),
                     ("{grow_preset: {epochs: many}}", "train.teacher_preset.grow_preset.epochs"),
                     ("{grow_preset: 3}", "train.teacher_preset.grow_preset"),
                     ("{sequence_preset: {}}", "train.teacher_preset.sequence_preset")):
        with pytest.raises(ConfigError) as err:
            load_config(None, [f"train.teacher_preset={bad}"])
        assert err.value.key == key, bad


def test_the_conformer_ctc_head_gets_its_preset_over_the_ctc_one():
    """conformer_ctc: train.ctc_preset, then train.conformer_ctc_preset over it (the demo's:
    a warm-up, a higher rate, more epochs); the GRU CTC student and the hybrid Conformer
    take none of it; --set still wins."""
    from core.config.loading import resolve_config

    both = ["train.ctc_preset={epochs: 14, lr: 0.002, sortagrad: true}",
            "train.conformer_ctc_preset={epochs: 20, lr: 0.004, lr_warmup_units: 2}"]
    conf = resolve_config(None, [*both, "train.model=conformer_ctc"])
    t = conf.config.train
    assert (t.passes.epochs, t.optim.lr, t.optim.lr_warmup_units, t.passes.sortagrad) == (
        20, 0.004, 2, True)
    assert conf.source("train.lr").startswith("train.conformer_ctc_preset")
    gru = load_config(None, [*both, "train.model=ctc"]).train
    assert (gru.passes.epochs, gru.optim.lr, gru.optim.lr_warmup_units) == (14, 0.002, 0)
    assert load_config(None, [*both, "train.model=conformer"]).train.optim.lr_warmup_units == 0
    assert load_config(None, [*both, "train.model=conformer_ctc",
                              "train.lr=0.001"]).train.optim.lr == 0.001
    local = load_config(ROOT / "configs" / "local.yaml",
                        ["train.model=conformer_ctc", "train.pseudolabels=r1"]).train
    assert (local.passes.epochs, local.optim.lr, local.optim.lr_warmup_units) == (20, 0.004, 2)
