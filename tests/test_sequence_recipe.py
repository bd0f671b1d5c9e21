"""`amflow sequence` (train.regime=sequence): sMBR / MMI training of a trained model on the
labeled split; its output dir, metrics, guards, bit-exact resume, and every trainer on two
ranks."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from core.runs import StepContext, StepError
from core.storage import Storage, join
from amflow.steps import train as train_step
from amflow.steps import sequence as sequence_step
from amflow.services import train_plan as launch
from training.checkpoint import load_model
from amflow.services.synthetic_run import make_synthetic_run
from training.loop import InjectedFailure, train_worker
from training.plan import WorkerPlan
from tests.test_train import TINY

torch.set_num_threads(1)

STUDENT = ["train.model=student", "train.regime=labeled", "train.epochs=3",
           "train.finetune_epochs=1", "train.tag=base"]
SEQUENCE = ["train.model=student", "train.regime=sequence", "train.tag=base", "train.epochs=2",
            "train.lr=0.002", "train.final_lr=0.001", "train.log_every=2"]


@pytest.fixture
def ce_model(tmp_path, local_cfg):
    """A synthetic run and a CE-trained student `train-base` in it."""
    make_synthetic_run(Storage(), join(str(tmp_path / "store"), "runs", "r"), noise=2.5,
                       splits={"labeled": {"utts": 40, "parts": 2},
                               "dev": {"utts": 12, "parts": 1}})
    cfg = local_cfg(*TINY, *STUDENT)
    return train_step.run(StepContext(cfg, "r", "train"), None)


def _sequence(local_cfg, *sets, expect=None):
    cfg = local_cfg(*TINY, *SEQUENCE, *sets)
    ctx = StepContext(cfg, "r", "sequence")
    if expect is None:
        return sequence_step.run(ctx, None)
    with pytest.raises(expect) as err:
        sequence_step.run(ctx, None)
    return err.value


@pytest.mark.parametrize("criterion", ["smbr", "mmi"])
def test_sequence_training_starts_from_the_ce_model_and_raises_its_objective(
        ce_model, local_cfg, tmp_path, criterion):
    # the last epoch shipped (not the dev choice, tests/test_sequence.py): the trained model
    out = _sequence(local_cfg, f"train.criterion={criterion}", "train.sequence_select=last")
    run = tmp_path / "store" / "runs" / "r"
    m = out["metrics"]
    assert m["model_uri"] == str(run / "sequence-base" / "model.pt")
    assert m["init_model"] == str(run / "train-base" / "model.pt")
    assert (run / "sequence-base" / "_SUCCESS.json").exists()
    assert m["criterion"] == criterion and m["recipe"] == "sequence"
    assert m["den_states"] > 1 and m["den_arcs"] > m["den_states"]
    # the criterion's own objective rises over training (sMBR: expected frame accuracy;
    # MMI: log p_num - log p_den per frame), and the frame accuracy is kept
    assert m[f"final_{criterion}_objective"] > m[f"first_{criterion}_objective"]
    assert m["dev_frame_acc"] >= ce_model["metrics"]["dev_frame_acc"] - 0.03
    records = [json.loads(line) for line in
               (run / "sequence-base" / "metrics.jsonl").read_text().splitlines()]
    assert all(f"{criterion}_objective" in r for r in records if r["kind"] == "train")
    # the model is the CE model's architecture, with priors for decoding
    model, meta = load_model(Storage(), m["model_uri"])
    base, _ = load_model(Storage(), m["init_model"])
    assert meta["spec"] == load_model(Storage(), m["init_model"])[1]["spec"]
    assert meta.get("priors") is not None
    assert any(not torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                     base.state_dict().values()))


def test_sequence_needs_a_trained_model(tmp_path, local_cfg):
    make_synthetic_run(Storage(), join(str(tmp_path / "store"), "runs", "r"),
                       splits={"labeled": {"utts": 8, "parts": 1}})
    err = _sequence(local_cfg, expect=StepError)
    assert "train-base/model.pt not found" in str(err) and "amflow train" in str(err)


def test_sequence_refuses_an_init_model_of_another_kind(ce_model, local_cfg):
    err = _sequence(local_cfg, "train.model=teacher", expect=StepError)
    assert "is a student" in str(err) and "trains a teacher" in str(err)


def test_sequence_resume_equals_uninterrupted_bitwise(ce_model, local_cfg, tmp_path):
    common = ["train.checkpoint_every=3", "model.student.dropout=0.2",
              "train.sequence_select=last"]  # the trained models compared, not a choice
    ref = _sequence(local_cfg, *common, "train.init_model=" + ce_model["metrics"]["model_uri"],
                    "train.tag=ref")
    fail = 5
    killed = _sequence(local_cfg, *common, "train.tag=resumed", f"train.fail_after={fail}",
                       "train.init_model=" + ce_model["metrics"]["model_uri"],
                       expect=InjectedFailure)
    assert f"minibatch {fail}" in str(killed)
    resumed = _sequence(local_cfg, *common, "train.tag=resumed", f"train.fail_after={fail}",
                        "train.init_model=" + ce_model["metrics"]["model_uri"])
    assert resumed["resumed_from_step"] == 3
    a, b = (load_model(Storage(), s["metrics"]["model_uri"])[0].state_dict()
            for s in (ref, resumed))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed["metrics"]["final_smbr_objective"] == ref["metrics"]["final_smbr_objective"]


def _rank_entry(rank: int, world: int, plans: list[WorkerPlan]) -> list[dict]:
    return [train_worker(plan) for plan in plans]  # one process group, one training after another


def test_every_trainer_runs_the_sequence_recipe_on_two_ranks(ce_model, local_cfg):
    """The criterion sits under the trainers' interface: each one trains with it in an
    initialised torch.distributed group."""
    from training.distributed import spawn_local

    extra = {"htm": ["train.group_size=2"], "ma": ["train.ma_samples=400"],
             "bmuf": ["train.block_size=3"]}
    plans = []
    for algorithm in ("sgd", "gtc", "bmuf", "htm", "ma"):
        cfg = local_cfg(*TINY, *SEQUENCE, "train.epochs=1", "train.workers=2",
                        f"train.algorithm={algorithm}", f"train.tag=base-{algorithm}",
                        "train.init_model=" + ce_model["metrics"]["model_uri"],
                        *extra.get(algorithm, []))
        ctx = StepContext(cfg, "r", f"sequence-base-{algorithm}")
        plan, _ = launch.build_plan(ctx, ctx.step_uri)
        plans.append(dataclasses.replace(plan, progress=False))
    rank0 = spawn_local(_rank_entry, 2, plans, timeout=300)[0]
    for algorithm, result in zip(("sgd", "gtc", "bmuf", "htm", "ma"), rank0):
        m = result["metrics"]
        assert m["workers"] == 2 and m["criterion"] == "smbr" and m["algorithm"] == algorithm
        assert np.isfinite(m["final_smbr_objective"]) and m["steps"] > 0
