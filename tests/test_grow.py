"""Growing a phone-class model into context-dependent leaves (training/grow.py,
`train.init_model` on the labeled and ssl recipes)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from core.runs import StepContext, StepError
from core.senones import CONTEXT_KIND, ContextTree
from core.storage import Storage, join
from amflow.steps import train as train_step
from amflow.services import train_plan as launch
from training.priors import class_counts
from training.checkpoint import load_model, save_model
from amflow.services.synthetic_run import make_synthetic_run
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
STUDENT = ["train.model=student", "train.regime=labeled", "train.epochs=1",
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
    # configs/local.yaml grows in-run (train.grow), but a given init model is started from
    assert "phone_stage_classes" not in out["metrics"] and "grown" not in out["metrics"]
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


# ----------------------------------------------------------------- train.grow: one run
GROW = ["train.grow=true", "train.grow_preset.epochs=1", "train.grow_preset.lr=0.005"]


def test_the_phone_tree_numbers_each_phone_as_leaf_center_reads_the_leaves():
    tree = ContextTree.from_dict(TREE)
    phones = tree.phone_tree()
    assert phones.context_free and phones.num_leaves == 4
    assert phones.leaf_phone == tree.center_phones == PHONES
    # leaf l of the tree is class leaf_center[l] of the phone tree: the same phone
    assert [phones.leaf_phone[c] for c in tree.leaf_center] == tree.leaf_phone
    assert phones.phone_tree() == phones


def _phone_labeled_copy(run: str, dest: str) -> None:
    """`run` with every stored leaf label (labels, frame_labels) replaced by its phone's
    class in TREE's phone tree: what a run aligned at one class per phone stores."""
    import shutil

    import pyarrow as pa

    from core import records

    shutil.copytree(run, dest)
    st = Storage()
    center = ContextTree.from_dict(TREE).leaf_center
    for uri in st.list(join(dest, "repartition"), recursive=True):
        if not uri.endswith(".parquet"):
            continue
        t = st.read_parquet(uri)
        for col in ("labels", "frame_labels"):
            vals = [records.encode_int16(center[records.decode_int16(v)]) if v else v
                    for v in t.column(col).to_pylist()]
            t = t.set_column(t.schema.get_field_index(col), col,
                             pa.array(vals, t.schema.field(col).type))
        st.write_parquet(uri, t)
    phones = ContextTree.from_dict(TREE).phone_tree()
    st.write_json(join(dest, "features", "context.json"), phones.to_dict())
    st.write_json(join(dest, "features", "phones.json"), phones.class_names)


def test_train_grow_trains_the_phone_model_of_a_phone_run_then_grows_it(tmp_path, local_cfg):
    """One `amflow train` with train.grow = the two-run way: its phone stage is the model a
    run labeled with the leaves' phones trains (bitwise, one thread), grown and trained on
    with train.grow_preset; the phone model is a decodable model of its own (priors)."""
    run = _cd_run(tmp_path)
    _phone_labeled_copy(run, join(str(tmp_path / "store"), "runs", "rp"))
    out = train_step.run(StepContext(local_cfg(*TINY, *STUDENT, *GROW), "r", "train"), None)
    m = out["metrics"]
    stage = join(run, "train-grown", "phones", "model.pt")
    assert m["init_model"] == stage and m["phone_stage_classes"] == 4
    assert 0 < m["phone_stage_dev_frame_acc"] <= 1 and m["phone_stage_steps"] > 0
    grown, meta = load_model(Storage(), m["model_uri"])
    assert grown.num_classes == 8 and meta["phones"] == ContextTree.from_dict(TREE).class_names
    assert m["passes"] == 1  # grow_preset's epochs, not the recipe's

    first, first_meta = load_model(Storage(), stage)
    phones = ContextTree.from_dict(TREE).phone_tree()
    assert first.num_classes == 4 and first_meta["phones"] == phones.class_names
    alone = train_step.run(StepContext(local_cfg(*TINY, *STUDENT), "rp", "train"), None)
    ref, ref_meta = load_model(Storage(), alone["metrics"]["model_uri"])
    for (name, a), b in zip(first.state_dict().items(), ref.state_dict().values()):
        assert torch.equal(a, b), name
    assert first_meta["priors"]["counts"] == ref_meta["priors"]["counts"]
    assert (m["phone_stage_dev_frame_acc"]
            == pytest.approx(alone["metrics"]["dev_frame_acc"], abs=0))


def test_phone_targets_are_the_teachers_posterior_summed_per_phone_at_its_temperature():
    from training.losses import distill_loss, phone_targets

    torch.manual_seed(0)
    tree = ContextTree.from_dict(TREE)
    center = torch.as_tensor(tree.leaf_center)
    idx = torch.stack([torch.randperm(8)[:5] for _ in range(6)]).view(2, 3, 5)
    logit = 3 * torch.randn(2, 3, 5)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    student = torch.randn(2, 3, 4, requires_grad=True)
    for T in (1.0, 2.0):
        pidx, plogit = phone_targets(idx, logit, center, -1.0e4, T)
        assert pidx.shape == (2, 3, 4) and plogit.shape == (2, 3, 4)
        leaf = torch.softmax(torch.full((2, 3, 8), -1.0e4).scatter(-1, idx, logit) / T, -1)
        phone = torch.zeros(2, 3, 4).index_add(-1, center, leaf)
        assert torch.allclose(torch.softmax(plogit / T, -1), phone, atol=1e-6)
        got = distill_loss(student, pidx, plogit, mask, -1.0e4, T).loss
        want = -(phone * torch.log_softmax(student / T, -1)).sum(-1)[mask].mean() * T * T
        assert torch.allclose(got, want, atol=1e-5)


def test_train_grow_grows_an_ssl_student_on_leaf_targets(tmp_path, local_cfg):
    """The ssl recipe's phone stage reads the leaf teacher's top-k targets summed per phone
    and the labeled split's leaves as phones; the grown stage runs grow_preset's one
    unlabeled pass."""
    run = join(str(tmp_path / "store"), "runs", "r")
    st = Storage()
    make_synthetic_run(st, run, num_classes=8, splits={
        "labeled": {"utts": 12, "parts": 1}, "unlabeled": {"utts": 24, "parts": 1, "soft_k": 4},
        "dev": {"utts": 6, "parts": 1}})
    st.write_json(join(run, "features", "context.json"), TREE)
    st.write_json(join(run, "features", "phones.json"), ContextTree.from_dict(TREE).class_names)
    ssl = ["train.model=student", "train.regime=ssl", "train.sub_epochs=2",
           "train.unlabeled_passes=1", "train.finetune_epochs=1", "train.tag=grown"]
    out = train_step.run(StepContext(local_cfg(*TINY, *ssl, *GROW), "r", "train"), None)
    m = out["metrics"]
    assert m["recipe"] == "ssl" and m["phone_stage_classes"] == 4 and m["passes"] == 4
    first, meta = load_model(st, join(run, "train-grown", "phones", "model.pt"))
    assert first.num_classes == 4
    # its priors: the soft targets' mass and the labels, per phone (all of each frame's)
    counts = np.array(meta["priors"]["counts"])
    leaves = class_counts(st, [join(run, "repartition", s, "part-00000.parquet")
                                      for s in ("labeled", "unlabeled")], 8)
    assert np.allclose(counts, np.bincount(ContextTree.from_dict(TREE).leaf_center,
                                           weights=leaves, minlength=4))
    assert load_model(st, m["model_uri"])[0].num_classes == 8


def test_train_grow_keeps_a_finished_phone_stage_of_its_config_even_under_force(
        tmp_path, local_cfg):
    """A finished phone stage is grown again by a rerun whose phone stage is the same
    training (another grown recipe included); one of another config is refused, and
    --force trains it again. --force keeps one of the same config and inputs: training it
    again gives the same model, bit for bit."""
    run = _cd_run(tmp_path)
    cfg = local_cfg(*TINY, *STUDENT, *GROW)
    train_step.run(StepContext(cfg, "r", "train"), None)
    st = Storage()
    summary = join(run, "train-grown", "phones", "summary.json")
    written = st.read_json(summary)
    phone_weights = load_model(st, written["model_uri"])[0].state_dict()
    # the grown stage lost (a killed run): the rerun grows the kept phone model again
    st.delete(join(run, "train-grown", "_SUCCESS.json"))
    for uri in st.list(join(run, "train-grown", "checkpoints"), recursive=True):
        st.delete(uri)
    st.write_json(summary, {**written, "metrics": {**written["metrics"], "steps": -1}})
    again = train_step.run(StepContext(cfg, "r", "train"), None)
    assert again["metrics"]["phone_stage_steps"] == -1  # read back, not retrained
    # another grown recipe grows the same phone stage (the recipe is not the phone stage's)
    st.delete(join(run, "train-grown", "_SUCCESS.json"))
    for uri in st.list(join(run, "train-grown", "checkpoints"), recursive=True):
        st.delete(uri)
    longer = train_step.run(StepContext(local_cfg(*TINY, *STUDENT, *GROW,
                                                  "train.grow_preset.epochs=2"), "r", "train"),
                            None)
    assert longer["metrics"]["phone_stage_steps"] == -1 and longer["metrics"]["passes"] == 2
    # the finished step is not handed back for another grown recipe
    with pytest.raises(StepError, match=r"finished a different training.*train.grow_preset"):
        train_step.run(StepContext(cfg, "r", "train"), None)
    # another phone stage (its epochs) is not taken for this one's
    st.delete(join(run, "train-grown", "_SUCCESS.json"))
    with pytest.raises(StepError, match=r"phone stage of a different training.*epochs"):
        train_step.run(StepContext(local_cfg(*TINY, *STUDENT, *GROW, "train.epochs=2"), "r",
                                   "train"), None)
    forced = train_step.run(StepContext(cfg, "r", "train", force=True), None)
    assert forced["metrics"]["phone_stage_steps"] == -1  # kept, the grown stage retrained
    assert forced["metrics"]["passes"] == 1  # this config's grown stage, not `longer`'s
    for uri in st.list(join(run, "train-grown", "phones"), recursive=True):
        st.delete(uri)
    retrained = train_step.run(StepContext(cfg, "r", "train", force=True), None)
    assert retrained["metrics"]["phone_stage_steps"] == written["metrics"]["steps"]
    again = load_model(st, written["model_uri"])[0].state_dict()
    assert all(torch.equal(phone_weights[k], again[k]) for k in phone_weights)
    two = train_step.run(StepContext(local_cfg(*TINY, *STUDENT, *GROW, "train.epochs=2"), "r",
                                     "train", force=True), None)
    assert two["metrics"]["phone_stage_steps"] == 2 * written["metrics"]["steps"]


def test_train_grow_grows_nothing_on_phone_classes(tmp_path, local_cfg):
    from core.config import ConfigError

    with pytest.raises(ConfigError, match="train.grow_preset.tag"):
        local_cfg("train.grow_preset.tag=x")
    make_synthetic_run(Storage(), join(str(tmp_path / "store"), "runs", "r"), num_classes=4,
                       splits={"labeled": {"utts": 8, "parts": 1}})
    run = join(str(tmp_path / "store"), "runs", "r")
    phones = ContextTree.from_dict(TREE).phone_tree()
    Storage().write_json(join(run, "features", "context.json"), phones.to_dict())
    Storage().write_json(join(run, "features", "phones.json"), phones.class_names)
    out = train_step.run(StepContext(local_cfg(*TINY, *STUDENT, *GROW), "r", "train"), None)
    m = out["metrics"]  # the classes are phones already: trained as they are
    assert m["grown"] is False and "phone_stage_classes" not in m and m["passes"] == 1
    assert not Storage().exists(join(run, "train-grown", "phones", "summary.json"))


def test_progress_names_the_grow_stage():
    """Each stage counts its own minibatches from 0 %: the progress line says which stage
    (issue 60: the % restarted between stages with no word why)."""
    from types import SimpleNamespace as NS

    from training.loop import progress_label

    cfg = NS(train=NS(sequence=NS(criterion="smbr")))

    def plan(**kw):
        return NS(**{"cfg": cfg, "kind": "student", "label_tree": None, "grow": None,
                     "num_classes": 40, **kw})
    assert progress_label(plan()) == "train student"
    assert progress_label(plan(label_tree={"x": 1}, num_classes=12)) == \
        "train stage 1/2 (train.grow: 12 phone classes) student"
    assert progress_label(plan(grow=object())) == \
        "train stage 2/2 (train.grow: 40 leaves, from the phone model) student"
    assert progress_label(plan(), criterion=object()) == "sequence (smbr) student"
