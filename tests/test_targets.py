"""The targets step end to end on synthetic feature shards and a saved teacher."""
import json
import subprocess

import numpy as np
import pyarrow as pa
import pytest
import torch

from core.records import FEATURE_SCHEMA, PAD_LOGIT, decode_topk, encode_feats
from core.runs import StepContext
from amflow.steps import targets as targets_step
from tasks import targets as T
from tests.conftest import ROOT, amflow_bin
from training.checkpoint import load_model, save_model
from training.models import TeacherBLSTM

DIM, CLASSES = 12, 9


def _make_run(cfg, run_id: str, shards: int = 3, utts: int = 6) -> StepContext:
    ctx = StepContext(cfg, run_id, "features")
    rng = np.random.default_rng(0)
    stats = {"count": 0, "sum": np.zeros(DIM), "sumsq": np.zeros(DIM)}
    for s in range(shards):
        rows = []
        for u in range(utts):
            x = rng.standard_normal((int(rng.integers(5, 80)), DIM)).astype(np.float32) * 2 + 1
            stats["count"] += len(x)
            stats["sum"] += x.sum(0)
            stats["sumsq"] += (x.astype(np.float64) ** 2).sum(0)
            rows.append({"utt_id": f"s{s}-u{u}", "speaker_id": f"spk{s}", "split": "unlabeled",
                         "condition": f"DP{u % 5 + 1}", "shard": f"unlabeled-{s:05d}",
                         "labels": None, "frame_labels": None, **encode_feats(x, "uint8")})
        ctx.storage.write_parquet(ctx.path("shards", f"unlabeled-{s:05d}.parquet"),
                                  pa.Table.from_pylist(rows, schema=FEATURE_SCHEMA))
    ctx.storage.write_json(ctx.path("cmvn.json"), {k: (v.tolist() if hasattr(v, "tolist") else v)
                                                   for k, v in stats.items()})
    ctx.finish(inputs={}, counts={"in": shards * utts, "out": shards * utts}, metrics={})
    torch.manual_seed(0)
    teacher = TeacherBLSTM(DIM, 16, 1, CLASSES)
    save_model(ctx.storage, ctx.other("train", "model.pt"), teacher,
               cmvn=ctx.storage.read_json(ctx.path("cmvn.json")),
               phones=[f"p{i}" for i in range(CLASSES)], features={})
    return ctx


@pytest.mark.integration
def test_targets_cover_every_row_and_rerun_is_noop(local_cfg, ray_local):
    # the paper's layout: every frame's k entries, fp16, best first
    cfg = local_cfg("targets.k=4", "targets.actors=2", "targets.fidelity_sample_frames=500",
                    "targets.mass=1.0", "targets.codec=fp16")
    feats = _make_run(cfg, "r1")
    summary = targets_step.run(StepContext(cfg, "r1", "targets"))
    assert summary["counts"] == {"in": 18, "out": 18, "rejected": 0}
    fid = summary["metrics"]["fidelity"]
    assert set(fid) == {"1", "5"} and fid["5"]["mass_kept"] > fid["1"]["mass_kept"]
    # aligned row for row with the feature shards; argmax of the rebuilt = teacher argmax
    model, meta = load_model(feats.storage, feats.other("train", "model.pt"))
    from core.records import decode_feats, load_cmvn

    scorer = T.TeacherScorer(model, *load_cmvn(meta["cmvn"]))
    agree = total = 0
    for shard in T.feature_shards(feats.storage, feats.step_uri):
        frows = feats.storage.read_parquet(feats.path("shards", f"{shard}.parquet")).to_pylist()
        trows = feats.storage.read_parquet(
            feats.other("targets", "shards", f"{shard}.parquet")).to_pylist()
        assert [r["utt_id"] for r in frows] == [r["utt_id"] for r in trows]
        for fr, tr in zip(frows, trows):
            idx, logit = decode_topk(tr)
            assert idx.shape == (fr["num_frames"], 4) and tr["num_frames"] == fr["num_frames"]
            assert (np.diff(logit, axis=1) <= 0).all()  # sorted, best first
            full = scorer.score([decode_feats(fr)])[0]
            agree += int((full.argmax(-1).numpy() == idx[:, 0]).sum())
            total += len(idx)
    assert agree / total >= 0.999
    assert feats.storage.exists(feats.other("targets", "_SUCCESS.json"))
    # re-run: nothing to do, the same summary (the same finish time, which repartition's
    # plan compares) and outputs
    before = feats.storage.read_bytes(feats.other("targets", "shards", "unlabeled-00000.parquet"))
    again = targets_step.run(StepContext(cfg, "r1", "targets"))
    assert again == summary
    assert feats.storage.read_bytes(
        feats.other("targets", "shards", "unlabeled-00000.parquet")) == before


@pytest.mark.integration
def test_targets_are_scored_again_for_another_teacher_or_k_not_for_other_actors(
        local_cfg, ray_local):
    """Scored shards are kept only for the plan they were scored under: a teacher trained
    again at the same URI or another targets.k scores every shard again; the keys that
    only place the scoring (targets.actors) hand back the finished step."""
    cfg = local_cfg("targets.k=3", "targets.fidelity_sample_frames=200")
    feats = _make_run(cfg, "r4", shards=2)
    first = targets_step.run(StepContext(cfg, "r4", "targets"))
    assert targets_step.run(StepContext(local_cfg("targets.k=3", "targets.actors=1",
                                                  "targets.fidelity_sample_frames=200"),
                                        "r4", "targets")) == first
    torch.manual_seed(1)  # another teacher of the same shape, saved where the first was
    save_model(feats.storage, feats.other("train", "model.pt"), TeacherBLSTM(DIM, 16, 1, CLASSES),
               cmvn=feats.storage.read_json(feats.path("cmvn.json")),
               phones=[f"p{i}" for i in range(CLASSES)], features={})
    retaught = targets_step.run(StepContext(cfg, "r4", "targets"))
    assert retaught["metrics"]["shards_skipped"] == 0
    assert retaught["finished_at"] >= first["finished_at"] and retaught != first
    wider = targets_step.run(StepContext(local_cfg("targets.k=5",
                                                   "targets.fidelity_sample_frames=200"),
                                         "r4", "targets"))
    assert wider["metrics"]["shards_skipped"] == 0 and wider["metrics"]["k"] == 5
    row = feats.storage.read_parquet(feats.other("targets", "shards",
                                                 "unlabeled-00000.parquet")).to_pylist()[0]
    assert decode_topk(row)[0].shape[1] == 5


@pytest.mark.integration
def test_pruned_targets_keep_fewer_entries_and_read_back_whole(local_cfg, ray_local):
    """targets.mass < 1: each frame stores only the entries that hold the mass; with
    targets.codec=sqrt15 in two bytes each (the fp16 layout's pruning: test_targets_core)."""
    cfg = local_cfg("targets.k=6", "targets.mass=0.3", "targets.fidelity_sample_frames=500",
                    "targets.codec=sqrt15")
    feats = _make_run(cfg, "r3", shards=2)
    metrics = targets_step.run(StepContext(cfg, "r3", "targets"))["metrics"]
    assert metrics["mass"] == 0.3 and 1 <= metrics["entries_per_frame"] < 6
    assert metrics["codec"] == "sqrt15" and metrics["bytes_per_frame"] > 0
    assert metrics["fidelity"]["5"]["entries_per_frame"] < 5
    entries = frames = 0
    for shard in T.feature_shards(feats.storage, feats.step_uri):
        table = feats.storage.read_parquet(feats.other("targets", "shards", f"{shard}.parquet"))
        # the codec's dtypes, as arrays any Parquet reader sees
        assert [table.schema.field(c).type.value_type for c in
                ("topk_idx", "topk_logit", "topk_len")] == [pa.uint8()] * 3
        for tr in table.to_pylist():
            lens = np.asarray(tr["topk_len"], np.uint8)
            assert tr["topk_code"] == "sqrt15-u8" and len(tr["topk_idx"]) == lens.sum()
            idx, logit = decode_topk(tr)
            assert idx.shape == (tr["num_frames"], 6) == (len(lens), 6)
            assert ((logit > PAD_LOGIT).sum(1) == lens).all()
            entries, frames = entries + int(lens.sum()), frames + len(lens)
    assert metrics["entries_per_frame"] == pytest.approx(entries / frames, abs=1e-3)


@pytest.mark.integration
def test_targets_killed_half_way_finishes_the_rest(local_cfg, ray_local):
    cfg = local_cfg("targets.k=3")
    feats = _make_run(cfg, "r2")
    targets_step.run(StepContext(cfg, "r2", "targets"))
    # simulate a kill after one shard: drop two shards' markers and outputs, and the
    # _SUCCESS.json a killed step never wrote
    feats.storage.delete(feats.other("targets", "_SUCCESS.json"))
    for s in ("unlabeled-00001", "unlabeled-00002"):
        feats.storage.delete(feats.other("targets", "_shards", f"{s}.json"))
        feats.storage.delete(feats.other("targets", "shards", f"{s}.parquet"))
    again = targets_step.run(StepContext(cfg, "r2", "targets"))
    assert again["metrics"]["shards_skipped"] == 1
    assert again["counts"] == {"in": 18, "out": 18, "rejected": 0}


@pytest.mark.integration
@pytest.mark.slow
def test_gpu_path_forced_onto_cpu(tmp_path):
    """A Ray with one (declared) GPU: the actor takes num_gpus=1 and runs the model in fp16."""
    from core.config import load_config

    store = tmp_path / "store"
    cfg = load_config(ROOT / "configs/local.yaml", [f"storage.root={store}"])
    _make_run(cfg, "gpu")
    proc = subprocess.run(
        f"{amflow_bin()} targets --config configs/local.yaml --run-id gpu "
        f"--set storage.root={store} --set ray.num_gpus=1 --set targets.actors=1 "
        "--set targets.num_gpus_per_actor=1 --set targets.fp16_on_cpu=true --set targets.k=5",
        shell=True, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1].split(" ", 1)[1])
    (actor,) = summary["metrics"]["actors"]
    assert actor["fp16"] is True and actor["device"] == "cpu" and len(actor["gpu_ids"]) == 1
    assert summary["counts"]["out"] == 18
    assert summary["metrics"]["fidelity"]["5"]["argmax_agreement"] > 0.99


def test_missing_teacher_is_a_clear_error(local_cfg):
    from core.runs import StepError

    cfg = local_cfg("targets.teacher=/nonexistent/model.pt")
    _make_run(cfg, "r3")
    with pytest.raises(StepError, match="teacher checkpoint not found"):
        targets_step.run(StepContext(cfg, "r3", "targets"))


def test_a_teacher_of_other_classes_is_a_clear_error(local_cfg):
    """The student learns from the targets and from its labeled split's labels: a teacher
    whose classes are not the run's features' classes stops the step before any scoring."""
    from core.runs import StepError

    cfg = local_cfg()
    ctx = _make_run(cfg, "r4")
    ctx.storage.write_json(ctx.path("phones.json"), [f"p{i}/{i}" for i in range(CLASSES)])
    with pytest.raises(StepError, match=r"teacher .* 9 classes, this run's features 9 .* "
                                        r"differ from class 0"):
        targets_step.run(StepContext(cfg, "r4", "targets"))
