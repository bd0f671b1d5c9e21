"""The training data loader: coverage, chunking, offsets, CMVN, rank shares, resume."""
import numpy as np
import pytest
import torch

from core import records
from core.runs import StepError
from core.storage import Storage, join
from amflow.services.synthetic_run import make_synthetic_run
from training.data import (BatchLoader, Normalizer, PassSpec, SplitIndex, loader_throughput,
                           plan_pass, rank_partitions, rows_table, spec_augment, synthetic_rows)
from training.losses import IGNORE

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("loader") / "runs" / "r")
    st = Storage()
    info = make_synthetic_run(st, root, splits={
        "labeled": {"utts": 30, "parts": 4}, "unlabeled": {"utts": 24, "parts": 2, "soft_k": 3},
        "dev": {"utts": 6, "parts": 1}})
    norm_stats = st.read_json(join(root, "features", "cmvn.json"))
    return st, root, info, norm_stats


def _index(run, split="labeled", target="labels"):
    st, _, info, stats = run
    idx = SplitIndex.load(st, info["splits"][split], target)
    return st, idx, Normalizer.from_stats(stats, idx.feat_dim)


@pytest.mark.parametrize("mode", ["chunk", "full"])
@pytest.mark.parametrize("offset", [0, 1, 2])
def test_every_frame_is_scored_once_per_pass(run, mode, offset):
    st, idx, norm = _index(run)
    spec = PassSpec(mode=mode, offset=offset, chunk_frames=8, left_context=3, right_context=2,
                    minibatch_frames=64, shuffle_partitions=2, seed=5)
    loader = BatchLoader(st, idx, spec, norm)
    frames = sum(b.frames for b in loader)
    expected = idx.total_frames - (len(idx) if offset else 0)  # offset > 0 loses one row
    assert frames == loader.plan.frames == expected
    assert loader.num_batches == len(list(BatchLoader(st, idx, spec, norm).batches()))


def test_chunks_have_context_budget_and_correct_labels(run):
    st, idx, norm = _index(run)
    spec = PassSpec(mode="chunk", offset=1, chunk_frames=8, left_context=3, right_context=2,
                    minibatch_frames=64, shuffle_partitions=4)
    plan = plan_pass(idx, spec)
    pieces = np.concatenate([b for w in plan.windows for b in w.batches])
    assert ((pieces[:, 4] - pieces[:, 3]) <= 8).all()
    rows = idx.frames[pieces[:, 0]] - 1  # offset 1
    # windows hold the chunk and keep the full length (8 + 3 + 2) inside the utterance
    assert ((pieces[:, 1] <= pieces[:, 3]) & (pieces[:, 4] <= pieces[:, 2])).all()
    assert (pieces[:, 2] - pieces[:, 1] == np.minimum(13, rows)).all()
    assert (pieces[:, 2] <= rows).all() and (pieces[:, 1] >= 0).all()
    inner = (pieces[:, 3] >= 3) & (pieces[:, 4] + 2 <= rows)  # chunks away from the edges
    assert (pieces[inner, 3] - pieces[inner, 1] == 3).all()
    assert all(len(b) <= 64 // 8 for w in plan.windows for b in w.batches)
    # chunks of many utterances are mixed within a minibatch
    assert len(set(plan.windows[0].batches[0][:, 0].tolist())) > 2
    # the batch content equals the offset-1 features and labels of the utterance
    loader = BatchLoader(st, idx, spec, norm, keep_utts=True)
    table = st.read_parquet(idx.uris[0]).to_pylist()
    b = next(iter(loader))
    u, s0, e0, s1, e1 = (int(v) for v in plan.windows[0].batches[0][0])
    row = next(r for r in st.read_parquet(idx.uris[idx.part[u]]).to_pylist()
               if r["utt_id"] == idx.utt_ids[u])
    x = norm(records.shift_offset(records.decode_feats(row), 1, 3))
    y = records.offset_labels(records.decode_int16(row["frame_labels"]), 1, 3, len(x))
    assert torch.allclose(b.x[0, :e0 - s0], torch.from_numpy(x[s0:e0]))
    lab = b.labels[0]
    assert (lab[:s1 - s0] == IGNORE).all() and (lab[e1 - s0:] == IGNORE).all()
    assert torch.equal(lab[s1 - s0:e1 - s0], torch.from_numpy(y[s1:e1]))
    assert table  # partitions are readable plain parquet


def test_cmvn_is_applied(run):
    st, idx, norm = _index(run)
    xs = torch.cat([b.x[b.mask] for b in BatchLoader(st, idx, PassSpec(mode="full"), norm)])
    assert abs(float(xs.mean())) < 0.05 and abs(float(xs.std()) - 1.0) < 0.05


def test_full_mode_batches_whole_utterances_by_padded_budget(run):
    st, idx, norm = _index(run)
    spec = PassSpec(mode="full", minibatch_frames=200)
    for b in BatchLoader(st, idx, spec, norm):
        assert b.x.shape[0] == 1 or b.x.shape[0] * b.x.shape[1] <= 200
        assert torch.equal(b.mask.sum(1), b.lengths)  # every frame of each utterance


def test_soft_targets_and_subepoch_spans(run):
    st, idx, norm = _index(run, "unlabeled", "topk")
    assert len(idx) == 24 and idx.target == "topk"
    spans = [(i / 3, (i + 1) / 3) for i in range(3)]
    plans = [plan_pass(idx, PassSpec(span=s, order_seed=9, seed=i)) for i, s in enumerate(spans)]
    assert sum(p.utterances for p in plans) == len(idx)
    assert sum(p.frames for p in plans) == idx.total_frames
    b = next(iter(BatchLoader(st, idx, PassSpec(span=spans[1], order_seed=9), norm)))
    assert b.labels is None and b.topk_idx.shape[-1] == 3
    assert (b.topk_logit[b.mask][:, 0] >= b.topk_logit[b.mask][:, 1]).all()


def test_rank_shares_are_disjoint_and_complete(run):
    _, _, info, _ = run
    uris = info["splits"]["labeled"]
    shares = [rank_partitions(uris, r, 2, "labeled") for r in range(2)]
    assert sorted(shares[0] + shares[1]) == sorted(uris) and not set(shares[0]) & set(shares[1])
    with pytest.raises(StepError, match="fewer than"):
        rank_partitions(uris, 4, 5, "labeled")


def test_resume_skips_exactly_and_order_is_deterministic(run):
    st, idx, norm = _index(run)
    spec = PassSpec(chunk_frames=8, minibatch_frames=48, shuffle_partitions=2, seed=3)
    full = [b.x for b in BatchLoader(st, idx, spec, norm)]
    again = [b.x for b in BatchLoader(st, idx, spec, norm, start=5)]
    assert len(again) == len(full) - 5
    assert all(torch.equal(a, b) for a, b in zip(full[5:], again))
    other = [b.x for b in BatchLoader(st, idx, PassSpec(chunk_frames=8, minibatch_frames=48,
                                                        shuffle_partitions=2, seed=4), norm)]
    assert not all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(full, other))
    limited = BatchLoader(st, idx, spec, norm)
    limited.set_limit(3)
    assert len(list(limited)) == 3


def test_bad_rows_are_rejected_with_reasons(tmp_path):
    st = Storage()
    means = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    rows = synthetic_rows(5, means, 3, 0, "labeled")
    rows[1]["labels"] = rows[1]["frame_labels"] = None
    rows[2].update(records.encode_feats(np.zeros((0, 12), np.float32), "float16"))
    uri = str(tmp_path / "part-00000.parquet")
    st.write_parquet(uri, rows_table(rows))
    idx = SplitIndex.load(st, [uri], "labels")
    assert len(idx) == 3 and idx.rows_in == 5
    assert idx.rejected == {"missing_labels": 1, "empty_features": 1}
    soft = SplitIndex.load(st, [uri], "topk")
    assert len(soft) == 0 and soft.rejected["missing_soft_targets"] == 4


@pytest.mark.parametrize("code", ["fp16", "sqrt31"])
def test_pruned_soft_targets_load_padded_and_malformed_ones_are_rejected(tmp_path, code):
    """targets.mass < 1 rows (topk_len) load as [T, k] like full ones, in either codec; a
    row whose topk_len does not count its frames is a reject, not a crash."""
    st = Storage()
    means = np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32)
    rows = synthetic_rows(4, means, 3, 0, "unlabeled", soft_k=4)
    rng = np.random.default_rng(1)
    lens = []
    for i, r in enumerate(rows):  # one table holds one code: the last row full, unpruned
        idx, logit = records.decode_topk(r)
        lens.append(rng.integers(1, 5, len(idx)) if i < 3 else None)
        logp = logit - np.log(np.exp(logit).sum(1, keepdims=True))  # the sqrt codes' input
        r.update(records.encode_topk(idx, logp, lens[-1], code, 6))
    rows[2]["topk_len"] = rows[2]["topk_len"][:-1]
    uri = str(tmp_path / "part-00000.parquet")
    st.write_parquet(uri, rows_table(rows))
    idx = SplitIndex.load(st, [uri], "topk")
    assert len(idx) == 3 and idx.rejected == {"missing_soft_targets": 1}
    norm = Normalizer.from_stats(None, idx.feat_dim)
    batches = list(BatchLoader(st, idx, PassSpec(mode="full", minibatch_frames=10_000), norm))
    kept = sum(int((b.topk_logit[b.mask] > records.PAD_LOGIT).sum()) for b in batches)
    assert kept == int(sum(x.sum() for x in lens[:2])) + rows[3]["num_frames"] * 4


def test_prefetch_thread_propagates_errors_and_stops(run):
    st, idx, norm = _index(run)
    loader = BatchLoader(st, idx, PassSpec(chunk_frames=8, minibatch_frames=16), norm,
                         prefetch=2)
    it = iter(loader)
    next(it)
    it.close()  # stopping early joins the producer
    assert loader._ahead._thread is None  # the Prefetch under the loader
    broken = SplitIndex.load(st, idx.uris, "labels")
    broken.uris = [u + ".missing" for u in broken.uris]
    with pytest.raises(Exception):
        list(BatchLoader(st, broken, PassSpec(), norm))


def test_loader_throughput_is_measured(run):
    st, idx, norm = _index(run)
    r = loader_throughput(st, idx, PassSpec(), norm)
    assert r["frames"] == idx.total_frames and r["frames_per_s"] > 0


def test_spec_augment_masks_bands_and_spans_reproducibly():
    x = torch.randn(4, 30, 3 * 16) + 5.0
    y = spec_augment(x, torch.Generator().manual_seed(1), 3, freq_masks=2, freq_mask_bins=4,
                     time_masks=2, time_mask_rows=3)
    assert torch.equal(y, spec_augment(x, torch.Generator().manual_seed(1), 3, 2, 4, 2, 3))
    zero = (y == 0)
    for b in range(4):
        cols = zero[b].all(0).reshape(3, 16)  # masked bins: whole columns ...
        assert torch.equal(cols[0], cols[1]) and torch.equal(cols[1], cols[2])  # ... per frame
        assert int(cols[0].sum()) <= 8 and int(zero[b].all(1).sum()) <= 6
        kept = ~zero[b]
        assert torch.equal(y[b][kept], x[b][kept])
    assert bool(zero.any())
