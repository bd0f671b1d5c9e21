"""`amflow train`: learns, resumes bitwise, stops on non-finite loss, distils, runs on N ranks."""
from __future__ import annotations

import dataclasses
import json
import pickle
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from core.runs import StepContext, StepError
from core.storage import Storage, join
from amflow.steps import train as train_step
from amflow.services import train_plan as launch
from training.checkpoint import load_model
from amflow.services.synthetic_run import make_synthetic_run
from training.data import rows_table, synthetic_rows
from training.loop import InjectedFailure, train_worker
from training.plan import WorkerPlan
from tests.conftest import ROOT, amflow_bin

torch.set_num_threads(1)

TINY = ["train.threads=1", "train.minibatch_frames=256", "train.chunk_frames=16",
        "train.chunk_left_context=4", "train.lr=0.01", "train.final_lr=0.002",
        "train.log_every=4", "model.student.layers=1", "model.student.hidden=32",
        "model.teacher.layers=1", "model.teacher.hidden=24", "model.student.dropout=0",
        "model.teacher.dropout=0", "model.student.lookahead=3", "train.temperature=1",
        "train.labeled_lr_scale=1.5", "train.optimizer=adam", "train.clip_grad_norm=5"]
# (synthetic features have no clean sources: the teacher recipe's example servers are off)
TEACHER = ["train.model=teacher", "train.regime=labeled", "train.epochs=4",
           "train.finetune_epochs=1", "train.augment.enabled=false"]
SSL = ["train.model=student", "train.regime=ssl", "train.sub_epochs=3", "train.finetune_epochs=1"]


def _synthetic(root: str, **splits) -> dict:
    return make_synthetic_run(Storage(), join(root, "runs", "r"), noise=1.5, splits=splits or {
        "labeled": {"utts": 60, "parts": 2}, "dev": {"utts": 16, "parts": 1}})


def _train(local_cfg, *overrides, expect=None):
    cfg = local_cfg(*TINY, *overrides)
    ctx = StepContext(cfg, "r", "train")
    if expect is None:
        return train_step.run(ctx, None)
    with pytest.raises(expect) as err:
        train_step.run(ctx, None)
    return err.value


def _weights(storage: Storage, uri: str) -> dict:
    return load_model(storage, uri)[0].state_dict()


def _records(path: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k not in ("time", "frames_per_s",
                                                                     "compute_s", "data_wait_s")}
            for line in path.read_text().splitlines()]


def test_resume_equals_uninterrupted_bitwise(tmp_path, local_cfg):
    """A training killed mid-pass resumes from its checkpoint and ends with the same model."""
    splits = {"labeled": {"utts": 24, "parts": 2}, "dev": {"utts": 8, "parts": 1},
              "unlabeled": {"utts": 48, "parts": 2, "soft_k": 3}}
    _synthetic(str(tmp_path / "store"), **splits)
    # dropout and SpecAugment masks draw random numbers: their state must resume too
    common = [*SSL, "train.checkpoint_every=3", "model.student.dropout=0.2",
              "train.freq_masks=1", "train.time_masks=1"]
    ref = _train(local_cfg, *common, "train.tag=ref")
    # die two minibatches after a checkpoint taken in the middle of a pass
    ends = np.cumsum(ref["minibatches_per_pass"])
    fail = next(s + 2 for s in range(3, int(ends[-1]), 3)
                if not any(e - 2 <= s <= e for e in ends))
    killed = _train(local_cfg, *common, "train.tag=resumed", f"train.fail_after={fail}",
                    expect=InjectedFailure)
    assert f"minibatch {fail}" in str(killed)
    ckpt_dir = tmp_path / "store" / "runs" / "r" / "train-resumed" / "checkpoints"
    last = json.loads((ckpt_dir / "latest.json").read_text())
    assert last["step"] == fail - 2 and last["batch"] > 0
    resumed = _train(local_cfg, *common, "train.tag=resumed", f"train.fail_after={fail}")
    assert resumed["resumed_from_step"] == last["step"]
    assert sum(resumed["minibatches_per_pass"]) == resumed["metrics"]["steps"] > fail
    st = Storage()
    a, b = (_weights(st, s["metrics"]["model_uri"]) for s in (ref, resumed))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    run = tmp_path / "store" / "runs" / "r"
    assert _records(run / "train-ref" / "metrics.jsonl") == \
        _records(run / "train-resumed" / "metrics.jsonl")
    assert resumed["metrics"]["dev_frame_acc"] == ref["metrics"]["dev_frame_acc"]
    # a changed training knob cannot silently continue someone else's checkpoint
    (run / "train-resumed" / "_SUCCESS.json").unlink()
    err = _train(local_cfg, *common, "train.tag=resumed", "train.lr=0.5", expect=StepError)
    assert "--force" in str(err) and "lr" in str(err)


def test_a_finished_training_is_taken_only_for_the_config_it_trained_with(tmp_path, local_cfg):
    """A rerun hands back the finished model when its config trains the same one on the
    same inputs (operational keys and other trainings' recipes may differ) and names what
    differs otherwise; a summary from before the config was kept is taken, unchecked."""
    _synthetic(str(tmp_path / "store"))
    common = ["train.model=student", "train.regime=labeled", "train.epochs=1",
              "train.finetune_epochs=0"]
    first = _train(local_cfg, *common)
    again = _train(local_cfg, *common, "train.log_every=2", "train.sequence_preset.lr=0.5",
                   "model.teacher.hidden=8")  # the teacher's section: not this model's
    assert again["finished_at"] == first["finished_at"]
    for change, key in (("train.epochs=2", "train.epochs"),
                        ("model.student.hidden=16", "model.student.hidden"),
                        ("train.augment.room_prob=0.1", "train.augment")):
        err = _train(local_cfg, *common, change, expect=StepError)
        assert f"differs in: {key}" in str(err) and "--force" in str(err), change
    # the examples made again since (repartition re-ran): not the data it trained on
    rep = tmp_path / "store" / "runs" / "r" / "repartition" / "_SUCCESS.json"
    rep.write_text(json.dumps({"step": "repartition", "finished_at": "2026-11-29T01:00:00"}))
    err = _train(local_cfg, *common, expect=StepError)
    assert "differs in: inputs.repartition_finished_at" in str(err)
    success = tmp_path / "store" / "runs" / "r" / "train" / "_SUCCESS.json"
    old = json.loads(success.read_text())
    del old["config_fingerprint"]
    success.write_text(json.dumps(old))
    assert _train(local_cfg, *common, "train.epochs=2")["finished_at"] == first["finished_at"]


def test_a_teacher_resumed_in_a_new_process_draws_the_same_dropout_masks(tmp_path, local_cfg):
    """A checkpoint restores the global RNG that dropout draws from; nothing a new process
    does for the first time may draw from it (the teacher's padded path, first used by a
    dev score, once did: its weightless LSTM shells are built on first use)."""
    from training.models import lstm_layer_template

    _synthetic(str(tmp_path / "store"), labeled={"utts": 24, "parts": 2},
               dev={"utts": 8, "parts": 1})
    common = [*TEACHER, "train.checkpoint_every=3", "model.teacher.dropout=0.3",
              "model.teacher.layers=2"]
    lstm_layer_template.cache_clear()  # each training as the first in its process
    ref = _train(local_cfg, *common, "train.tag=ref")
    # die in the second pass, after the first pass's dev score built the shells
    ends = np.cumsum(ref["minibatches_per_pass"])
    fail = next(s + 2 for s in range((int(ends[0]) // 3 + 1) * 3, int(ends[-1]), 3)
                if not any(e - 2 <= s <= e for e in ends))
    _train(local_cfg, *common, "train.tag=resumed", f"train.fail_after={fail}",
           expect=InjectedFailure)
    lstm_layer_template.cache_clear()
    resumed = _train(local_cfg, *common, "train.tag=resumed", f"train.fail_after={fail}")
    assert ends[0] < resumed["resumed_from_step"] < ends[-1]
    a, b = (_weights(Storage(), s["metrics"]["model_uri"]) for s in (ref, resumed))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_nonfinite_loss_stops_the_step_and_keeps_the_model(tmp_path, local_cfg):
    root = str(tmp_path / "store")
    _synthetic(root, labeled={"utts": 40, "parts": 2})
    # a third partition holding one utterance whose features are NaN
    means = np.random.default_rng(1).standard_normal((8, 16)).astype(np.float32)
    rows = synthetic_rows(20, means, 3, 7, "labeled")
    rows[3]["feats"] = np.full((rows[3]["num_frames"], 48), np.nan, np.float16).reshape(-1)
    Storage().write_parquet(join(root, "runs", "r", "repartition", "labeled", "part-00002.parquet"),
                            rows_table(rows))
    for seed in range(4):  # until the bad minibatch comes after the first checkpoint
        tag = f"s{seed}"
        err = _train(local_cfg, *TEACHER, "train.checkpoint_every=1", "train.shuffle_partitions=1",
                     f"train.seed={seed}", f"train.tag={tag}", expect=StepError)
        assert "non-finite loss" in str(err) and "was not updated" in str(err)
        train_dir = Path(root) / "runs" / "r" / f"train-{tag}"
        assert not (train_dir / "model.pt").exists() and not (train_dir / "_SUCCESS.json").exists()
        if (train_dir / "checkpoints" / "latest.json").exists():
            break
        assert "no checkpoint" in str(err)
    latest = json.loads((train_dir / "checkpoints" / "latest.json").read_text())
    assert f"checkpoint {latest['name']}" in str(err)
    state = torch.load(train_dir / "checkpoints" / latest["name"] / "rank-0.pt", weights_only=False)
    assert all(torch.isfinite(v).all() for v in state["model"].values())


def test_phone_weight_needs_context_dependent_classes(tmp_path, local_cfg):
    _synthetic(str(tmp_path / "store"), labeled={"utts": 8, "parts": 1})
    err = _train(local_cfg, *TEACHER, "train.phone_weight=1", expect=StepError)
    assert "train.phone_weight needs context-dependent classes" in str(err)


def test_distillation_from_topk_targets_trains_a_student(tmp_path, local_cfg):
    """Scheduled learning on soft top-k targets, with very little labeled data."""
    root = str(tmp_path / "store")
    _synthetic(root, labeled={"utts": 4, "parts": 1},
               unlabeled={"utts": 400, "parts": 2, "soft_k": 4}, dev={"utts": 16, "parts": 1})
    # (the synthetic phones carry no information about their successors, so a long
    # look-ahead only makes the task harder here)
    knobs = ["train.checkpoint_every=1000", "train.lr=0.02", "model.student.lookahead=1"]
    out = _train(local_cfg, *SSL, *knobs, "train.sub_epochs=4", "train.labeled_lr_scale=1.0")
    m = out["metrics"]
    assert m["dev_frame_acc"] > 0.9, m
    recs = _records(Path(root) / "runs" / "r" / "train" / "metrics.jsonl")
    soft = [r for r in recs if r.get("kind") == "train" and r["data"] == "unlabeled"]
    assert soft[-1]["loss"] < 0.6 * soft[0]["loss"]
    # the student alone (4 labeled utterances, same schedule) does much worse
    sup = _train(local_cfg, *knobs, "train.model=student", "train.regime=labeled",
                 "train.epochs=4", "train.finetune_epochs=1", "train.tag=sup")
    assert m["dev_frame_acc"] > sup["metrics"]["dev_frame_acc"] + 0.05


def test_teacher_trained_by_amflow_train(tmp_path):
    """`amflow train` on a learnable synthetic task: high dev frame accuracy, all outputs."""
    root = tmp_path / "store"
    _synthetic(str(root))
    cmd = [*amflow_bin().split(), "train", "--config", str(ROOT / "configs" / "local.yaml"),
           "--run-id", "r", "--set", f"storage.root={root}"]
    for o in [*TINY, *TEACHER, "train.tag=teacher", "train.checkpoint_every=10"]:
        cmd += ["--set", o]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1].split(" ", 1)[1])
    assert summary["metrics"]["dev_frame_acc"] > 0.95, summary["metrics"]
    assert "frames_per_s" in summary["metrics"] and "[train teacher]" in proc.stderr
    out = root / "runs" / "r" / "train-teacher"
    for name in ("model.pt", "metrics.jsonl", "learning_curve.png", "_SUCCESS.json"):
        assert (out / name).exists(), name
    success = json.loads((out / "_SUCCESS.json").read_text())
    assert success["counts"] == {"in": 60, "out": 60, "rejected": 0}
    assert success["metrics"]["dev_frame_acc"] == summary["metrics"]["dev_frame_acc"]
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    first = recs[0]
    for key in ("loss", "frame_acc", "lr", "frames_per_s", "bytes_sent", "comm_seconds",
                "frames_seen"):
        assert key in first
    assert sorted({r["offset"] for r in recs if r["kind"] == "train"}) == [0, 1, 2]
    assert {r["mode"] for r in recs if r["kind"] == "train"} == {"chunk", "full"}
    model, meta = load_model(Storage(), str(out / "model.pt"))
    assert meta["spec"]["kind"] == "teacher" and len(meta["phones"]) == model.num_classes
    assert meta["cmvn"]["count"] > 0 and meta["features"]["stack"] == 3
    # a finished training is not redone
    again = subprocess.run(cmd + ["--set", "train.tag=teacher"], capture_output=True, text=True,
                           timeout=300, cwd=ROOT)
    assert again.returncode == 0 and "already finished" in again.stderr


def _rank_entry(rank: int, world: int, plan: WorkerPlan) -> dict:
    return train_worker(plan)


def test_train_worker_on_two_ranks(tmp_path, local_cfg):
    """The same worker function inside an initialised torch.distributed group."""
    from training.distributed import spawn_local

    root = str(tmp_path / "store")
    _synthetic(root, labeled={"utts": 40, "parts": 2}, dev={"utts": 6, "parts": 1})
    cfg = local_cfg(*TINY, *TEACHER, "train.epochs=2", "train.workers=2",
                    "train.algorithm=sgd", "train.checkpoint_every=6")
    ctx = StepContext(cfg, "r", "train")
    plan, _ = launch.build_plan(ctx, ctx.step_uri)
    # The typed config itself travels to the workers (pickled as it is, no dict form).
    assert plan.cfg is cfg and plan.launch.storage_path == f"{ctx.step_uri}/ray"
    assert pickle.loads(pickle.dumps(plan)) == plan
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.kind = "student"
    plan = dataclasses.replace(plan, progress=False)
    results = spawn_local(_rank_entry, 2, plan, timeout=300)
    assert [r["rank"] for r in results] == [0, 1] and results[0]["world"] == 2
    m = results[0]["metrics"]
    assert m["workers"] == 2 and m["algo_bytes_sent"] > 0
    assert results[0]["counts"] == {"in": 40, "out": 40, "rejected": 0}
    ckpt = Path(root) / "runs" / "r" / "train" / "checkpoints"
    latest = json.loads((ckpt / "latest.json").read_text())
    assert latest["world"] == 2
    assert {p.name for p in (ckpt / latest["name"]).iterdir()} == {"rank-0.pt", "rank-1.pt"}
    assert m["dev_frame_acc"] > 0.8


def test_max_change_caps_each_tensor_update():
    from training.loop import MaxChangeOptimizer

    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3)
    opt = MaxChangeOptimizer(torch.optim.SGD(lin.parameters(), lr=10.0), max_change=0.01)
    before = [p.detach().clone() for p in lin.parameters()]
    lin(torch.randn(8, 4)).pow(2).sum().backward()
    opt.step()
    for b, p in zip(before, lin.parameters()):
        assert float((p.detach() - b).norm()) == pytest.approx(0.01, rel=1e-4)
    assert opt.capped == 2 and opt.param_groups[0]["lr"] == 10.0
    assert opt.state_dict()["param_groups"][0]["lr"] == 10.0


def test_newbob_stops_early_and_fine_tunes(tmp_path, local_cfg):
    _synthetic(str(tmp_path / "store"), labeled={"utts": 30, "parts": 2},
               dev={"utts": 8, "parts": 1})
    out = _train(local_cfg, *TEACHER, "train.epochs=8", "train.finetune_epochs=1",
                 "train.schedule=newbob", "train.newbob_threshold=0.5", "train.min_lr=0.004",
                 "train.checkpoint_every=1000", "train.max_change=0.5")
    units = [r for r in _records(tmp_path / "store" / "runs" / "r" / "train" / "metrics.jsonl")
             if r["kind"] == "unit"]
    actions = [u["schedule"].get("action") for u in units]
    assert "halve" in actions and "stop" in actions
    assert units[-1]["unit"] == 7  # jumped to the fine-tuning epoch
    assert len(units) < 8 and out["metrics"]["newbob_halvings"] >= 1


@pytest.mark.integration
def test_train_and_resume_on_s3(s3_bucket, tmp_path):
    """The same step with storage.root on S3 (moto over HTTP): partitions, checkpoints,
    metrics and the model all go through the S3 API."""
    from core.config import load_config

    bucket, overrides = s3_bucket
    cfg = load_config(ROOT / "configs" / "local.yaml",
                      [f"storage.root=s3://{bucket}/amflow", *overrides, *TINY, *TEACHER,
                       "train.epochs=2", "train.checkpoint_every=3"])
    st = Storage(cfg.storage)
    make_synthetic_run(st, f"s3://{bucket}/amflow/runs/r", splits={
        "labeled": {"utts": 16, "parts": 2}, "dev": {"utts": 4, "parts": 1}})
    with pytest.raises(InjectedFailure):
        train_step.run(StepContext(load_config(ROOT / "configs" / "local.yaml", [
            f"storage.root=s3://{bucket}/amflow", *overrides, *TINY, *TEACHER,
            "train.epochs=2", "train.checkpoint_every=3", "train.fail_after=4"]), "r", "train"),
            None)
    out = train_step.run(StepContext(cfg, "r", "train"), None)
    assert out["resumed_from_step"] == 3
    uri = out["metrics"]["model_uri"]
    assert uri.startswith("s3://") and st.exists(uri)
    model, meta = load_model(st, uri)
    assert meta["spec"]["kind"] == "teacher"
    assert st.exists(f"s3://{bucket}/amflow/runs/r/train/learning_curve.png")


def test_a_checkpoint_from_before_a_new_config_key_still_resumes():

    from core.config import TrainConfig
    from training.loop import fingerprint_changes, train_fingerprint

    now = {"train": train_fingerprint(TrainConfig()), "kind": "student"}
    assert "criterion" in now["train"] and "lr" in now["train"]  # the user's flat keys
    for gone in ("criterion", "augment", "gtc_warmup"):
        old = {"train": {k: v for k, v in now["train"].items() if k != gone}, "kind": "student"}
        assert fingerprint_changes(old, now) == []
    changed = {"train": dict(now["train"], criterion="mmi"), "kind": "student"}
    assert fingerprint_changes(old, changed) == ["train.criterion"]
    assert fingerprint_changes(now, dict(now, kind="teacher")) == ["kind"]


def test_a_checkpoint_is_compared_on_the_trained_kinds_model_section_and_its_inputs():
    """Checkpoints once kept every kind's model section: a student's resumes after a
    teacher key changed, and a change of its own names the key. Inputs (when the data
    steps finished, the init model's digest) count when both sides name them."""
    from core.config import ModelConfig, load_config
    from training.loop import _model_fingerprint, fingerprint_changes, train_fingerprint

    def fp(*sets, inputs=None):
        cfg = load_config(None, ["train.model=student", *sets])
        return {"train": train_fingerprint(cfg.train),
                "model": _model_fingerprint(cfg.model, "student"), "kind": "student",
                "splits": {"labeled": ["a"]}, "num_classes": 9,
                "inputs": inputs or {"repartition_finished_at": "t0"}}

    old = {k: v for k, v in fp().items() if k != "inputs"}
    old["model"] = dataclasses.asdict(ModelConfig())  # every kind's section, as before
    assert fingerprint_changes(old, fp("model.teacher.hidden=8")) == []
    assert fingerprint_changes(old, fp("model.student.hidden=16")) == ["model.student.hidden"]
    assert fingerprint_changes(fp(), fp(inputs={"repartition_finished_at": "t1"})) == \
        ["inputs.repartition_finished_at"]
    assert fingerprint_changes(fp(), dict(fp(), splits={"labeled": ["b"]})) == ["splits"]


def test_the_recipes_are_compared_by_the_keys_they_set_not_as_mappings():
    """A recipe changes the training it applies to through that training's own keys; a
    training it does not apply to (a teacher's checkpoint and the sequence recipe, train.grow's
    phone stage and the grown stage's recipe) resumes, also from fingerprints that held the
    recipes (before they were left out)."""
    from core.config import load_config
    from training.loop import fingerprint_changes, train_fingerprint

    def fp(*sets):
        return {"train": train_fingerprint(load_config(None, list(sets)).train), "kind": "t"}

    base = fp("train.model=teacher")
    assert not {"teacher_preset", "sequence_preset", "grow_preset"} & set(base["train"])
    for other in ("train.sequence_preset.lr=0.5", "train.grow_preset.epochs=30",
                  "train.teacher_preset.grow_preset.epochs=30"):
        assert fingerprint_changes(base, fp("train.model=teacher", other)) == [], other
    # a fingerprint of before the presets were renamed (their old names)
    old = {**base, "train": {**base["train"], "grow_recipe": {"epochs": 30},
                             "sequence_recipe": {"lr": 0.5}}}
    assert fingerprint_changes(old, base) == []
    # what a recipe sets in the training it applies to still counts
    assert fingerprint_changes(base, fp("train.model=teacher",
                                        "train.teacher_preset.epochs=3")) == ["train.epochs"]

