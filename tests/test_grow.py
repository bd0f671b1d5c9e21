"""Growing a phone-class model into context-dependent leaves (training/grow.py,
`train.init_model` on the labeled and ssl recipes)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from amflow.runs import StepContext, StepError
from amflow.senones import CONTEXT_KIND, ContextTree
from amflow.storage import Storage, join
from amflow.steps import train as train_step
from training import launch
from training.checkpoint import load_model, save_model
from training.data import make_synthetic_run
from training.grow import (GrowError, class_phones, grow_output, leaf_log_shares,
                           output_sources)
from training.models import StudentLSTM, TeacherBLSTM
from tests.test_train import TINY

torch.set_num_threads(1)

# 8 leaves over 4 phones: sil one leaf, a two (left context b or not), b two (right
# context a or not), c three.
TREE = {"kind": CONTEXT_KIND, "phones": ["<eps>", "sil", "a", "b", "c"], "sil": "sil",
        "num_leaves": 8,
        "roots": {"1": 0, "2": [0, [3], 1, 2], "3": [1, [2], 3, 4],
                  "4": [0, [1], 5, [1, [2], 6, 7]]}}
PHONES = ["sil", "a", "b", "c"]
STUDENT = ["train.model=student", "train.recipe=labeled", "train.epochs=1",
           "train.finetune_epochs=0", "train.tag=grown"]


def test_a_grown_model_scores_each_leaf_as_its_phone_times_its_share():
    """p(leaf | x) = p(phone | x) x share(leaf): divided by the leaf's prior (the phone's
    prior x the same share) the decoder reads the phone model's scaled likelihoods."""
    torch.manual_seed(0)
    phone_model = TeacherBLSTM(6, 8, 1, 4).eval()
    leaf_phones = ContextTree.from_dict(TREE).leaf_phone
    sources = output_sources(PHONES, leaf_phones)
    assert sources == [0, 1, 1, 2, 2, 3, 3, 3]
    counts = np.array([50, 30, 10, 5, 0, 7, 7, 14], float)
    shares = leaf_log_shares(counts, sources)
    per_phone = np.bincount(sources, weights=np.exp(shares))
    assert np.allclose(per_phone, 1.0)  # each phone's leaves share all of its mass
    assert np.isfinite(shares).all()  # an unseen leaf (count 0) keeps a finite bias
    x = torch.randn(2, 5, 6)
    before = torch.log_softmax(phone_model(x), -1)
    grown = grow_output(phone_model, sources, shares)
    assert grown.num_classes == 8
    after = torch.log_softmax(grown(x), -1)
    expect = before[..., sources] + torch.tensor(shares, dtype=before.dtype)
    assert torch.allclose(after, expect, atol=1e-5)


def test_only_one_class_per_phone_covering_every_leaf_can_be_grown():
    with pytest.raises(GrowError, match="several classes of phone 'a'"):
        output_sources(["sil", "a", "a", "b"], ["a", "b"])
    with pytest.raises(GrowError, match=r"no class for phones \['c'\]"):
        output_sources(["sil", "a", "b"], ["sil", "a", "c", "c"])
    assert class_phones(["x", "y"], None) == ["x", "y"]
    assert class_phones([], TREE) == ContextTree.from_dict(TREE).leaf_phone


def _cd_run(tmp_path) -> str:
    """A synthetic run whose 8 classes are TREE's leaves (features.labels=align's files)."""
    run = join(str(tmp_path / "store"), "runs", "r")
    st = Storage()
    make_synthetic_run(st, run, num_classes=8, splits={"labeled": {"utts": 24, "parts": 1},
                                                        "dev": {"utts": 6, "parts": 1}})
    st.write_json(join(run, "features", "context.json"), TREE)
    st.write_json(join(run, "features", "phones.json"), ContextTree.from_dict(TREE).class_names)
    return run


def _phone_model(tmp_path, phones: list[str], kind: str = "student") -> str:
    uri = str(tmp_path / f"phones-{len(phones)}-{kind}.pt")
    torch.manual_seed(1)
    model = (StudentLSTM(48, 32, 1, len(phones), 3) if kind == "student"
             else TeacherBLSTM(48, 24, 1, len(phones)))
    save_model(Storage(), uri, model, cmvn=None, phones=phones, features={})
    return uri


def test_train_grows_a_phone_model_into_the_runs_leaves(tmp_path, local_cfg):
    run = _cd_run(tmp_path)
    init = _phone_model(tmp_path, PHONES)
    out = train_step.run(StepContext(local_cfg(*TINY, *STUDENT, f"train.init_model={init}"),
                                     "r", "train"), None)
    assert out["metrics"]["init_model"] == init
    model, meta = load_model(Storage(), out["metrics"]["model_uri"])
    assert model.num_classes == 8 and meta["phones"] == ContextTree.from_dict(TREE).class_names
    # the hidden layers started from the phone model's: same shapes, trained on from there
    start, _ = load_model(Storage(), init)
    assert model.lstm.weight_ih_l0.shape == start.lstm.weight_ih_l0.shape
    # the plan's growth: each leaf from its phone, shares of the run's labeled frames
    cfg = local_cfg(*TINY, *STUDENT, f"train.init_model={init}")
    plan, _ = launch.build_plan(StepContext(cfg, "r", "train-grown"), join(run, "x"))
    assert plan.grow.sources == (0, 1, 1, 2, 2, 3, 3, 3)
    assert np.allclose(np.bincount(plan.grow.sources, weights=np.exp(plan.grow.log_shares)), 1)


def test_train_refuses_init_models_it_cannot_grow(tmp_path, local_cfg):
    _cd_run(tmp_path)

    def refused(*sets: str) -> str:
        with pytest.raises(StepError) as err:
            train_step.run(StepContext(local_cfg(*TINY, *STUDENT, *sets), "r", "train"), None)
        return str(err.value)

    assert "no class for phones ['c']" in refused(
        f"train.init_model={_phone_model(tmp_path, ['sil', 'a', 'b'])}")
    assert "is a teacher" in refused(
        f"train.init_model={_phone_model(tmp_path, PHONES, 'teacher')}")
    assert "not found" in refused(f"train.init_model={tmp_path / 'none.pt'}")


def test_phone_classes_are_not_grown_into_other_phone_classes(tmp_path, local_cfg):
    make_synthetic_run(Storage(), join(str(tmp_path / "store"), "runs", "r"), num_classes=8,
                       splits={"labeled": {"utts": 8, "parts": 1}})
    init = _phone_model(tmp_path, PHONES)
    with pytest.raises(StepError, match="only a phone-class model can seed"):
        train_step.run(StepContext(local_cfg(*TINY, *STUDENT, f"train.init_model={init}"),
                                   "r", "train"), None)
