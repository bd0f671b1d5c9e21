"""repartition: equal partitions per split, a multiple of train.workers, hard and soft targets."""
from __future__ import annotations

import json

import numpy as np
import pytest
import pyarrow.parquet as pq

from core import records
from tests.conftest import CTM_LABELS
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
    cfg = local_cfg(CTM_LABELS, f"data.corpus={root}", "select.shard_hours=0.0005",
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
    bad, shards_written = None, 0
    for s in fidx["shards"]:
        if s["split"] != "unlabeled":
            continue
        frows = pq.read_table(store / "runs" / "r" / "features" / "shards" /
                              f"{s['shard']}.parquet").to_pylist()
        trows, old_layout = [], shards_written % 2 == 1
        for r in frows:
            n = r["num_frames"] + (1 if bad is None else 0)
            bad = bad or r["utt_id"]
            # targets.mass < 1: every other row in the shards that have topk_len
            pruned = rng.integers(1, 4, n) if len(trows) % 2 and not old_layout else None
            trows.append({"utt_id": r["utt_id"], **records.encode_topk(
                rng.permuted(np.tile(np.arange(10), (n, 1)), axis=1)[:, :3],
                rng.standard_normal((n, 3)), pruned)})
        import pyarrow as pa
        tdir = store / "runs" / "r" / "targets" / "shards"
        tdir.mkdir(parents=True, exist_ok=True)
        table = pa.Table.from_pylist(trows, schema=records.TARGET_SCHEMA)
        if old_layout:  # written before topk_len existed: still reads
            table = table.drop_columns(["topk_len"])
        pq.write_table(table, tdir / f"{s['shard']}.parquet")
        shards_written += 1
    (store / "runs" / "r" / "targets" / "_SUCCESS.json").write_text(
        json.dumps({"finished_at": "t1"}))
    (rep2,) = _steps(cfg, "r", "repartition")  # inputs changed: redone without --force
    assert rep2["counts"]["rejected"] == 1 and rep2["metrics"]["targets"]
    assert rep2["metrics"]["reject_reasons"] == {"target_mismatch": 1}
    index, parts = _read_split(store, "r", "unlabeled")
    assert index["targets"] and index["with_targets"] == index["rows"]
    pruned_rows = 0
    for rows in parts.values():
        for r in rows:
            assert r["utt_id"] != bad
            idx, logit = records.decode_topk(r)
            assert idx.shape == (r["num_frames"], 3)
            pruned_rows += r["topk_len"] is not None
    assert pruned_rows
    _, lab_parts = _read_split(store, "r", "labeled")
    assert all(r["topk_idx"] is None and r["labels"] for rows in lab_parts.values()
               for r in rows)
    (rep3,) = _steps(cfg, "r", "repartition")  # re-run: no-op
    assert rep3["finished_at"] == rep2["finished_at"]


# -- the map/reduce shuffle, in-process (Ray-free) so reads can be counted and a crash injected

@pytest.fixture()
def serial_shuffle(monkeypatch):
    """Run repartition's Ray stages serially in this process; count full parquet reads."""
    from core.raycluster import _run_shard
    from core.storage import Storage
    import amflow.steps.repartition as rp

    def serial(ctx, jobs, fn, job, **_):
        return [ctx.shard_done(sid) or _run_shard(fn, ctx, job, sid, payload)
                for sid, payload in jobs]

    reads: dict[str, int] = {}
    real_read = Storage.read_parquet

    def counting(self, uri, columns=None):
        if columns is None:
            reads[uri] = reads.get(uri, 0) + 1
        return real_read(self, uri, columns)

    monkeypatch.setattr(rp, "map_shards", serial)
    monkeypatch.setattr(Storage, "read_parquet", counting)
    return reads


def _with_targets(store, run):
    """Soft targets for the unlabeled shards: one utterance mismatched, one missing."""
    import pyarrow as pa

    fidx = json.loads((store / "runs" / run / "features" / "shards.json").read_text())
    rng = np.random.default_rng(0)
    tdir = store / "runs" / run / "targets" / "shards"
    tdir.mkdir(parents=True, exist_ok=True)
    bad = {}
    for s in fidx["shards"]:
        if s["split"] != "unlabeled":
            continue
        frows = pq.read_table(store / "runs" / run / "features" / "shards" /
                              f"{s['shard']}.parquet").to_pylist()
        trows = []
        for r in frows:
            if "missing_targets" not in bad and len(frows) > 1:
                bad["missing_targets"] = r["utt_id"]
                continue
            n = r["num_frames"]
            if "target_mismatch" not in bad:
                bad["target_mismatch"], n = r["utt_id"], n + 2
            trows.append({"utt_id": r["utt_id"], **records.encode_topk(
                rng.integers(0, 10, (n, 3)), rng.standard_normal((n, 3)))})
        pq.write_table(pa.Table.from_pylist(trows, schema=records.TARGET_SCHEMA),
                       tdir / f"{s['shard']}.parquet")
    (store / "runs" / run / "targets" / "_SUCCESS.json").write_text(
        json.dumps({"finished_at": "t1"}))
    return bad


def _snapshot(store, run):
    d = store / "runs" / run / "repartition"
    return {str(p.relative_to(d)): pq.read_table(p).to_pylist()
            for p in sorted(d.glob("*/part-*.parquet"))}


def _feature_setup(tmp_path, local_cfg, ray_local, parts_hours="0.0002", *extra):
    root = tmp_path / "corpus"
    make_corpus(root, speakers=6, utts=4, labeled=2, dev=1, seconds=(0.6, 1.5))
    cfg = local_cfg(CTM_LABELS, f"data.corpus={root}", "select.shard_hours=0.0005",
                    "select.splits=labeled,unlabeled,dev", "train.workers=2",
                    f"repartition.partition_hours={parts_hours}", *extra)
    _steps(cfg, "m", "select", "features")
    return cfg, tmp_path / "store"


def test_below_ray_inline_hours_the_partitions_are_made_in_the_step_and_are_the_same(
        tmp_path, local_cfg, ray_local, monkeypatch):
    """ray.inline_hours above the run's audio: features and repartition without Ray
    tasks, and the same partitions, row for row, as on Ray."""
    from amflow.steps import repartition as step

    inline = []

    def spy(*args, _real=step.map_shards, **kw):
        inline.append(kw.get("inline"))
        return _real(*args, **kw)

    monkeypatch.setattr(step, "map_shards", spy)
    root = tmp_path / "corpus"
    make_corpus(root, speakers=4, utts=3, labeled=2, dev=1, seconds=(0.6, 1.2))
    store = tmp_path / "store"
    parts = {}
    for run, hours in (("ray", 0.0), ("inline", 100.0)):
        cfg = local_cfg(CTM_LABELS, f"data.corpus={root}", "select.shard_hours=0.0005",
                        "select.splits=labeled,unlabeled,dev", "train.workers=2",
                        "repartition.partition_hours=0.0005", f"ray.inline_hours={hours}")
        _steps(cfg, run, "select", "features", "repartition")
        parts[run] = {split: sorted((r["utt_id"], r["split"], len(r["feats"]))
                                    for rows in _read_split(store, run, split)[1].values()
                                    for r in rows) for split in ("labeled", "unlabeled")}
    assert inline == [False] * 3 + [True] * 3  # plan, map, reduce: on Ray, then here
    assert parts["inline"] == parts["ray"] and parts["ray"]["labeled"]


def test_shuffle_reads_each_input_once_and_keeps_rejects(tmp_path, local_cfg, ray_local,
                                                         serial_shuffle):
    cfg, store = _feature_setup(tmp_path, local_cfg, ray_local)
    bad = _with_targets(store, "m")
    (rep,) = _steps(cfg, "m", "repartition")
    feat_dir = store / "runs" / "m" / "features" / "shards"
    shards = sorted(feat_dir.glob("*.parquet"))
    assert rep["metrics"]["partitions"] > len(shards) > 1  # every shard feeds many partitions
    for p in shards:
        assert serial_shuffle[str(p)] == 1, p
        tp = store / "runs" / "m" / "targets" / "shards" / p.name
        assert serial_shuffle.get(str(tp), 0) == (1 if tp.exists() else 0)
    assert rep["metrics"]["shards_read"] == len(shards)
    assert rep["metrics"]["reject_reasons"] == {"target_mismatch": 1, "missing_targets": 1}
    assert rep["counts"]["in"] == rep["counts"]["out"] + 2
    rej_dir = store / "runs" / "m" / "repartition" / "rejects"
    rejected = {r["utt_id"]: r["reason"] for p in rej_dir.glob("*.parquet")
                for r in pq.read_table(p).to_pylist()}
    assert rejected == {u: reason for reason, u in bad.items()}
    assert not (store / "runs" / "m" / "repartition" / "_buckets").exists()
    parts = _snapshot(store, "m")
    ids = [r["utt_id"] for rows in parts.values() for r in rows]
    assert len(ids) == len(set(ids)) == rep["counts"]["out"]
    assert not set(bad.values()) & set(ids)


def test_shuffle_resumes_after_a_crash_and_rebuilds_a_lost_partition(
        tmp_path, local_cfg, ray_local, serial_shuffle, monkeypatch):
    import amflow.steps.repartition as rp

    cfg, store = _feature_setup(tmp_path, local_cfg, ray_local)
    _with_targets(store, "m")
    _steps(cfg, "m", "repartition")
    clean = _snapshot(store, "m")
    step = store / "runs" / "m" / "repartition"

    real_reduce = rp.reduce_partition
    calls = []

    def crash_on_third(job, part_id, payload):
        calls.append(part_id)
        if len(calls) == 3:
            raise RuntimeError("worker lost")
        return real_reduce(job, part_id, payload)

    monkeypatch.setattr(rp, "reduce_partition", crash_on_third)
    with pytest.raises(RuntimeError, match="worker lost"):
        _steps(cfg, "m", "repartition", force=True)
    assert (step / "_buckets").is_dir() and not (step / "_SUCCESS.json").exists()
    monkeypatch.setattr(rp, "reduce_partition", real_reduce)
    serial_shuffle.clear()
    (rep,) = _steps(cfg, "m", "repartition")  # resumes: maps done, two partitions done
    assert not [u for u in serial_shuffle if "/features/shards/" in u]
    assert _snapshot(store, "m") == clean and not (step / "_buckets").exists()
    assert rep["metrics"]["reject_reasons"] == {"target_mismatch": 1, "missing_targets": 1}

    # a partition lost after the buckets were deleted: its source shards are mapped again
    lost = sorted(step.glob("unlabeled/part-*.parquet"))[0]
    lost.unlink()
    (step / "_shards" / f"unlabeled-{lost.stem}.json").unlink()
    (step / "_SUCCESS.json").unlink()
    serial_shuffle.clear()
    (rep2,) = _steps(cfg, "m", "repartition")
    reread = [u for u in serial_shuffle if "/features/shards/" in u]
    assert 0 < len(reread) < rep2["metrics"]["shards_read"]
    assert _snapshot(store, "m") == clean and not (step / "_buckets").exists()
    assert rep2["counts"] == rep["counts"]


def test_shuffle_windows_cover_every_shard_once_and_share_the_partitions():
    from tasks.repartition import shuffle_windows

    rng = np.random.default_rng(3)
    hours = rng.uniform(0.5, 1.5, size=200).tolist()
    assert shuffle_windows(hours, 0, 40, seed=1) == [(list(range(200)), 40)]
    assert shuffle_windows(hours, 256, 40, seed=1) == [(list(range(200)), 40)]
    windows = shuffle_windows(hours, 16, 40, seed=1)
    assert len(windows) == 13  # ceil(200 / 16)
    members = sorted(i for m, _ in windows for i in m)
    assert members == list(range(200))
    counts = [c for _, c in windows]
    assert sum(counts) == 40 and max(counts) - min(counts) <= 1
    per_part = [sum(hours[i] for i in m) / c for m, c in windows]
    assert max(per_part) - min(per_part) <= max(hours)  # about one shard's share
    assert windows != shuffle_windows(hours, 16, 40, seed=2)  # membership is drawn
    # never more windows than partitions, and none empty
    few = shuffle_windows(hours, 4, 6, seed=0)
    assert len(few) == 6 and all(m and c == 1 for m, c in few)


def test_windowed_shuffle_keeps_each_partition_inside_its_window(tmp_path, local_cfg,
                                                                 ray_local, serial_shuffle):
    cfg, store = _feature_setup(tmp_path, local_cfg, ray_local, "0.0002",
                                "repartition.window_shards=1")
    (rep,) = _steps(cfg, "m", "repartition")
    step = store / "runs" / "m" / "repartition"
    feat_dir = store / "runs" / "m" / "features" / "shards"
    shards = sorted(feat_dir.glob("*.parquet"))
    assert all(serial_shuffle[str(p)] == 1 for p in shards)
    assert rep["metrics"]["windows"] > len({p.name.split("-")[0] for p in shards})
    utt_shard = {u: p.stem for p in shards
                 for u in pq.read_table(p, columns=["utt_id"]).column("utt_id").to_pylist()}
    assign = {r["utt_id"]: r["part"] for p in (step / "_assign").glob("*.parquet")
              for r in pq.read_table(p).to_pylist()}
    assert set(assign) == set(utt_shard)
    seen = []
    for split in ("labeled", "unlabeled", "dev"):
        index, parts = _read_split(store, "m", split)
        assert len(parts) % 2 == 0
        sources = {}
        for name, rows in parts.items():
            part = int(name[len("part-"):-len(".parquet")])
            assert all(assign[r["utt_id"]] == part for r in rows)
            sources[part] = {utt_shard[r["utt_id"]] for r in rows}
            seen += [r["utt_id"] for r in rows]
        # with one shard per window, a partition draws from exactly one shard
        assert all(len(s) <= 1 for s in sources.values())
    assert sorted(seen) == sorted(utt_shard) and rep["counts"]["out"] == len(seen)
