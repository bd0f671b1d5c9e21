"""repartition: equal partitions per split, a multiple of train.workers, hard and soft targets."""
from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq

from amflow import records
from tests.test_features import _steps
from tests.test_select import make_corpus


def test_plan_partitions_balanced():
    from tasks.repartition import partition_count, plan_partitions

    rng = np.random.default_rng(0)
    frames = rng.integers(50, 400, size=1000)
    plan = plan_partitions(frames, 8, seed=1)
    assert sorted(np.concatenate(plan).tolist()) == list(range(1000))
    loads = [frames[p].sum() for p in plan]
    assert max(loads) - min(loads) <= frames.max()
    assert partition_count(1.0, 0.3, 4) == 4 and partition_count(1.0, 0.1, 4) == 12
    assert partition_count(0.01, 1.0, 3) == 3


def _read_split(store, run, split):
    d = store / "runs" / run / "repartition" / split
    index = json.loads((d / "_index.json").read_text())
    rows = {p["path"]: pq.read_table(d / p["path"]).to_pylist() for p in index["partitions"]}
    return index, rows


def test_repartition_hard_then_soft_targets(tmp_path, local_cfg, ray_local):
    root = tmp_path / "corpus"
    make_corpus(root, speakers=6, utts=4, labeled=2, dev=1, seconds=(0.6, 1.5))
    cfg = local_cfg(f"data.corpus={root}", "select.shard_hours=0.0005",
                    "select.splits=labeled,unlabeled,dev", "train.workers=2",
                    "repartition.partition_hours=0.0005")
    sel, feat, rep = _steps(cfg, "r", "select", "features", "repartition")
    assert rep["counts"]["in"] == feat["counts"]["out"] == rep["counts"]["out"]
    store = tmp_path / "store"
    seen = set()
    for split in ("labeled", "unlabeled", "dev"):
        index, parts = _read_split(store, "r", split)
        assert len(parts) % 2 == 0 and len(parts) >= 2
        frames = [p["frames"] for p in index["partitions"]]
        assert max(frames) - min(frames) <= 60  # one utterance at most (1.5 s = 50 rows)
        for rows in parts.values():
            for r in rows:
                assert r["split"] == split and r["utt_id"] not in seen
                seen.add(r["utt_id"])
                assert (r["labels"] is not None) == (split != "unlabeled")
                assert r["topk_idx"] is None
    assert len(seen) == feat["counts"]["out"]

    # targets appear: soft top-k rows aligned with the feature shards, one mismatched
    fidx = json.loads((store / "runs" / "r" / "features" / "shards.json").read_text())
    rng = np.random.default_rng(0)
    bad = None
    for s in fidx["shards"]:
        if s["split"] != "unlabeled":
            continue
        frows = pq.read_table(store / "runs" / "r" / "features" / "shards" /
                              f"{s['shard']}.parquet").to_pylist()
        trows = []
        for r in frows:
            n = r["num_frames"] + (1 if bad is None else 0)
            bad = bad or r["utt_id"]
            trows.append({"utt_id": r["utt_id"], **records.encode_topk(
                rng.integers(0, 10, (n, 3)), rng.standard_normal((n, 3)))})
        import pyarrow as pa
        tdir = store / "runs" / "r" / "targets" / "shards"
        tdir.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(trows, schema=records.TARGET_SCHEMA),
                       tdir / f"{s['shard']}.parquet")
    (store / "runs" / "r" / "targets" / "_SUCCESS.json").write_text(
        json.dumps({"finished_at": "t1"}))
    (rep2,) = _steps(cfg, "r", "repartition")  # inputs changed: redone without --force
    assert rep2["counts"]["rejected"] == 1 and rep2["metrics"]["targets"]
    assert rep2["metrics"]["reject_reasons"] == {"target_mismatch": 1}
    index, parts = _read_split(store, "r", "unlabeled")
    assert index["targets"] and index["with_targets"] == index["rows"]
    for rows in parts.values():
        for r in rows:
            assert r["utt_id"] != bad
            idx, logit = records.decode_topk(r)
            assert idx.shape == (r["num_frames"], 3)
    _, lab_parts = _read_split(store, "r", "labeled")
    assert all(r["topk_idx"] is None and r["labels"] for rows in lab_parts.values()
               for r in rows)
    (rep3,) = _steps(cfg, "r", "repartition")  # re-run: no-op
    assert rep3["finished_at"] == rep2["finished_at"]
