import copy

import numpy as np
import pytest
import torch

from core import records
from tasks.targets import (TeacherScorer, chunk_spans, fidelity,
                           length_batches, summarise_fidelity, top_entries, topk)
from training.losses import teacher_log_probs
from training.models import StudentLSTM, TeacherBLSTM


def test_length_batches_cover_every_index_once_within_budget():
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 400, size=200).tolist() + [5000]
    batches = length_batches(lengths, batch_frames=1000)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or max(lengths[i] for i in b) * len(b) <= 1000
    # sorted by length: padding stays small
    padded = sum(max(lengths[i] for i in b) * len(b) for b in batches)
    assert padded / sum(lengths) < 1.3


@pytest.mark.parametrize("n,maxf,ov", [(10, 100, 5), (1000, 100, 10), (1001, 300, 50), (7, 7, 3)])
def test_chunk_spans_tile_the_utterance(n, maxf, ov):
    spans = chunk_spans(n, maxf, ov)
    kept = [i for _, _, ks, ke in spans for i in range(ks, ke)]
    assert kept == list(range(n))
    for s, e, ks, ke in spans:
        assert e - s <= maxf and s <= ks < ke <= e
        assert ks - s >= min(ov, ks) and e - ke >= min(ov, n - ke)


def test_batched_scoring_equals_one_at_a_time():
    torch.manual_seed(0)
    model = TeacherBLSTM(12, 16, 2, 7)
    rng = np.random.default_rng(1)
    feats = [rng.standard_normal((n, 12)).astype(np.float32) for n in (3, 40, 17, 40, 9)]
    mean, inv = np.zeros(12, np.float32), np.ones(12, np.float32)
    batched = TeacherScorer(model, mean, inv, batch_frames=200).score(feats)
    single = [TeacherScorer(model, mean, inv, batch_frames=1).score([f])[0] for f in feats]
    for a, b in zip(batched, single):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_long_utterances_are_split_and_stitched():
    torch.manual_seed(0)
    model = StudentLSTM(8, 16, 1, 5, lookahead=0)  # unidirectional: context beyond overlap fades
    x = np.random.default_rng(2).standard_normal((600, 8)).astype(np.float32)
    mean, inv = np.zeros(8, np.float32), np.ones(8, np.float32)
    whole = TeacherScorer(model, mean, inv, max_frames=10_000).score([x])[0]
    split = TeacherScorer(model, mean, inv, max_frames=200, overlap=60).score([x])[0]
    assert split.shape == whole.shape
    assert (split.argmax(-1) == whole.argmax(-1)).float().mean() > 0.98


def test_fp16_path_runs_on_cpu():
    """The GPU path (model and inputs in fp16) forced onto the CPU agrees with fp32."""
    torch.manual_seed(0)
    model = TeacherBLSTM(12, 16, 1, 7)
    feats = [np.random.default_rng(3).standard_normal((30, 12)).astype(np.float32)]
    mean, inv = np.zeros(12, np.float32), np.ones(12, np.float32)
    f32 = TeacherScorer(copy.deepcopy(model), mean, inv).score(feats)[0]
    half_scorer = TeacherScorer(copy.deepcopy(model), mean, inv, dtype=torch.float16)
    assert next(half_scorer.model.parameters()).dtype == torch.float16
    half = half_scorer.score(feats)[0]
    assert half.dtype == torch.float32 and half.shape == f32.shape
    torch.testing.assert_close(half, f32, atol=2e-2, rtol=2e-2)


def test_bf16_cpu_path_on_padded_batches_agrees_with_fp32():
    """CPU actors score in bf16 where the CPU has it natively: same argmax nearly always."""
    from core.config import TargetsConfig
    from tasks.targets import inference_dtype
    torch.manual_seed(0)
    model = TeacherBLSTM(12, 32, 2, 9)
    rng = np.random.default_rng(4)
    feats = [rng.standard_normal((n, 12)).astype(np.float32) for n in (40, 17, 33, 5)]
    mean, inv = np.zeros(12, np.float32), np.ones(12, np.float32)
    f32 = TeacherScorer(copy.deepcopy(model), mean, inv).score(feats)
    bf16 = TeacherScorer(copy.deepcopy(model), mean, inv, dtype=torch.bfloat16).score(feats)
    for a, b in zip(f32, bf16):
        assert b.dtype == torch.float32 and a.shape == b.shape
        torch.testing.assert_close(b, a, atol=5e-2, rtol=5e-2)
    assert inference_dtype(TargetsConfig(cpu_precision="fp32"), "cpu") == torch.float32
    assert inference_dtype(TargetsConfig(cpu_precision="bf16"), "cpu") == torch.bfloat16
    forced = TargetsConfig(fp16_on_cpu=True, cpu_precision="bf16")
    assert inference_dtype(forced, "cpu") == torch.float16
    # fp16: false wins over fp16_on_cpu; cpu_precision then decides (auto: the CPU's bf16)
    off = TargetsConfig(fp16=False, fp16_on_cpu=True, cpu_precision="fp32")
    assert inference_dtype(off, "cpu") == torch.float32
    from core import precision
    auto = TargetsConfig(fp16=False, fp16_on_cpu=True)
    assert inference_dtype(auto, "cpu") == (
        torch.bfloat16 if precision.cpu_has_native_bf16() else torch.float32)


@pytest.mark.parametrize("capability, auto", [((7, 0), torch.float16), ((8, 0), torch.float32),
                                              ((9, 0), torch.float32)])
def test_gpu_precision_auto_takes_fp16_only_before_ampere(capability, auto, monkeypatch):
    """V100s (7.0) get fp16; from Ampere on TF32 makes fp32 the faster choice (bench/GPU.md).
    An explicit true/false is obeyed on any GPU; serving's `auto` follows the same rule."""
    from core.config import TargetsConfig
    from serving.recognizer import torch_dtype
    from tasks.targets import inference_dtype

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert inference_dtype(TargetsConfig(), "cuda") == auto
    assert inference_dtype(TargetsConfig(fp16=True), "cuda") == torch.float16
    assert inference_dtype(TargetsConfig(fp16=False), "cuda") == torch.float32
    assert torch_dtype("auto", "cuda") == auto and torch_dtype("auto", "cpu") == torch.float32
    assert torch_dtype("fp16", "cuda") == torch.float16


def test_topk_and_rebuild_keep_the_argmax():
    # seeded: with unseeded logits an fp16 tie between the top two can flip the argmax
    torch.manual_seed(0)
    logits = torch.randn(500, 60) * 4
    idx, val = topk(logits, 5)
    assert idx.dtype == np.int16 and val.dtype == np.float16 and idx.shape == (500, 5)
    q = teacher_log_probs(torch.from_numpy(idx), torch.from_numpy(val), 60, fill=-1e4)
    assert torch.equal(q.argmax(-1), logits.argmax(-1))
    assert torch.allclose(q.exp().sum(-1), torch.ones(500), atol=1e-5)


def test_fidelity_is_monotone_and_exact_at_full_k():
    logits = torch.randn(300, 40) * 3
    parts = [fidelity(logits[:150], ks=(1, 5, 20, 40)), fidelity(logits[150:], ks=(1, 5, 20, 40))]
    fid = summarise_fidelity(parts)
    masses = [fid[k]["mass_kept"] for k in ("1", "5", "20", "40")]
    kls = [fid[k]["kl_nats"] for k in ("1", "5", "20", "40")]
    assert masses == sorted(masses) and masses[-1] == pytest.approx(1.0, abs=1e-6)
    assert kls == sorted(kls, reverse=True) and kls[-1] == pytest.approx(0.0, abs=1e-3)
    assert fid["40"]["frames"] == 300
    # KL(rebuilt || full) of renormalised top-k is -log(mass kept), per frame
    one = fidelity(logits[:1], ks=(5,))[5]
    assert one["kl_sum"] == pytest.approx(-np.log(one["mass_sum"]), abs=2e-3)
    # a shard marker from before targets.mass (no entries_sum) kept all k per frame
    old = {5: {key: v for key, v in one.items() if key != "entries_sum"}}
    assert summarise_fidelity([old])["5"]["entries_per_frame"] == 5


def test_topk_scoring_equals_full_scoring_then_topk():
    """score_topk (top-k where the model ran) stores what score() + topk() stored,
    across batches and split pieces, and returns full logits only where asked."""
    torch.manual_seed(0)
    model = TeacherBLSTM(12, 16, 2, 30)
    rng = np.random.default_rng(5)
    feats = [rng.standard_normal((n, 12)).astype(np.float32) for n in (3, 40, 250, 17, 9)]
    mean, inv = np.zeros(12, np.float32), np.ones(12, np.float32)
    scorer = TeacherScorer(model, mean, inv, batch_frames=100, max_frames=120, overlap=20)
    full = scorer.score(feats)
    scored = scorer.score_topk(feats, 5, full=[1, 2])
    for u, (lg, sc) in enumerate(zip(full, scored)):
        idx, val = topk(lg, 5)
        assert np.array_equal(sc.topk_idx, idx) and np.array_equal(sc.topk_logit, val)
        assert sc.finite
        assert (sc.logits is not None) == (u in (1, 2))
    torch.testing.assert_close(scored[2].logits, full[2])
    pruned = scorer.score_topk(feats, 5, mass=0.5)
    for lg, sc in zip(full, pruned):
        assert np.array_equal(sc.topk_len, top_entries(lg, 5, mass=0.5)[2])
    assert all(sc.topk_len is None for sc in scored)


def test_pruned_targets_keep_the_fewest_entries_that_hold_the_mass():
    torch.manual_seed(1)
    logits = torch.randn(400, 67) * 3
    lens = torch.from_numpy(top_entries(logits, 20, mass=0.95)[2]).long()
    cum = logits.softmax(-1).sort(-1, descending=True).values.cumsum(-1)
    for t, n in enumerate(lens.tolist()):
        assert n == 20 or cum[t, n - 1] >= 0.95  # enough ...
        assert n == 1 or cum[t, n - 2] < 0.95  # ... and no more
    assert 1 < lens.float().mean() < 20

    idx, val = topk(logits, 20)
    row = records.encode_topk(idx, val, lens.numpy())
    assert row["topk_idx"].dtype == np.int16 and len(row["topk_idx"]) == int(lens.sum())
    got_idx, got_val = records.decode_topk(row)
    keep = np.arange(20) < lens.numpy()[:, None]
    assert np.array_equal(got_idx[keep], idx[keep])
    assert np.array_equal(got_val[keep], val[keep].astype(np.float32))
    # a dropped slot names a class the frame does not keep, at no mass
    assert (got_val[~keep] == records.PAD_LOGIT).all()
    assert all(len(set(r)) == 20 for r in got_idx.tolist())

    # what the student sees is the kept entries renormalised; fidelity reports exactly that
    q = teacher_log_probs(torch.from_numpy(got_idx), torch.from_numpy(got_val), 67,
                          fill=-1e4).exp()
    p = logits.softmax(-1)
    kept_mass = (p.gather(-1, torch.from_numpy(idx).long()) * torch.from_numpy(keep)).sum(-1)
    f = fidelity(logits, ks=(20,), mass=0.95)[20]
    assert f["entries_sum"] == int(lens.sum())
    assert f["mass_sum"] == pytest.approx(float(kept_mass.sum()), rel=1e-5)
    assert f["kl_sum"] == pytest.approx(float(-kept_mass.log().sum()), rel=2e-2)
    best = torch.from_numpy(idx[:, :1]).long()  # the teacher's best keeps the most
    assert torch.equal(q.gather(-1, best).squeeze(-1), q.max(-1).values)

    bad = dict(row, topk_len=row["topk_len"][:-1])
    with pytest.raises(ValueError, match="entries in topk_len"):
        records.decode_topk(bad)


def test_fidelity_sample_takes_the_first_utterances_up_to_the_budget():
    from tasks.targets import fidelity_sample
    feats = [np.zeros((n, 2)) for n in (10, 5, 20, 7)]
    assert fidelity_sample(feats, 12) == [0, 1]
    assert fidelity_sample(feats, 0) == []
    assert fidelity_sample(feats, 1000) == [0, 1, 2, 3]


def test_bench_targets_mass_sweep_stores_fewer_bytes_as_the_mass_drops():
    from bench.targets import _stored

    torch.manual_seed(2)
    logits = torch.randn(300, 67) * 3
    rows = [_stored(logits, 20, m, "fp16", 9) for m in (1.0, 0.99, 0.9)]
    assert rows[0]["entries_per_frame"] == 20
    for a, b in zip(rows, rows[1:]):
        assert b["entries_per_frame"] < a["entries_per_frame"]
        assert b["bytes_per_frame"] < a["bytes_per_frame"]
        assert b["mass_kept"] < a["mass_kept"]
        assert b["kl_nats"] > a["kl_nats"]
    # the sqrt code keeps the same entries in about half the bytes (2 of 4 per entry; on
    # random logits zstd finds no runs), for a little KL
    sq = _stored(logits, 20, 0.99, "sqrt31", 9)
    assert sq["entries_per_frame"] == rows[1]["entries_per_frame"]
    assert sq["mass_kept"] == rows[1]["mass_kept"]
    assert sq["bytes_per_frame"] <= 0.55 * rows[1]["bytes_per_frame"]
    assert rows[1]["kl_nats"] < sq["kl_nats"] < rows[1]["kl_nats"] + 0.02


@pytest.mark.parametrize("num_classes,width", [(67, 1), (300, 2)])
def test_sqrt_code_stores_two_bytes_per_entry_in_class_order_and_reads_back(num_classes, width):
    """targets.codec=sqrt<L>: one index byte (<= 256 classes, else two) and one byte of
    sqrt(p) per entry; each frame's entries in class order; the student reads back the
    teacher's probabilities to within a level, and fidelity reports exactly what it reads."""
    torch.manual_seed(2)
    logits = torch.randn(300, num_classes) * 3
    idx, logp, lens = top_entries(logits, 20, "sqrt31", mass=0.95)
    lens = torch.from_numpy(lens).long()
    # the log-probabilities (top - logsumexp: log_softmax's values to float rounding)
    assert logp.dtype == np.float32 and np.allclose(
        logp, torch.log_softmax(logits, -1).gather(-1, torch.from_numpy(idx).long()).numpy(),
        atol=1e-5)
    row = records.encode_topk(idx, logp, lens.numpy(), "sqrt31", num_classes)
    n = int(lens.sum())
    assert row["topk_code"] == f"sqrt31-u{8 * width}"
    flat = row["topk_idx"]
    assert flat.dtype == (np.uint8 if width == 1 else np.uint16) and len(flat) == n
    assert row["topk_logit"].dtype == np.uint8 and len(row["topk_logit"]) == n
    starts = np.concatenate([[0], np.cumsum(lens.numpy())])
    for t in range(len(lens)):
        assert (np.diff(flat[starts[t]:starts[t + 1]].astype(int)) > 0).all()

    got_idx, got_val = records.decode_topk(row)
    keep = got_val > records.PAD_LOGIT
    assert (keep.sum(1) == lens.numpy()).all()
    p = logits.softmax(-1)
    raised = 0
    for t in range(len(lens)):  # the same classes, each probability within half a level ...
        kept = sorted(idx[t, :lens[t]].tolist())
        assert sorted(got_idx[t][keep[t]].tolist()) == kept
        s_got = np.sqrt(np.exp(got_val[t][keep[t]]))
        s_true = np.sqrt(p[t, got_idx[t][keep[t]]].numpy())
        off = np.abs(s_got - np.maximum(s_true, 1 / 31)) > 0.5 / 31 + 1e-6
        # ... but where the best class would tie another: it is raised one level above
        best = got_idx[t][keep[t]] == idx[t, 0]
        assert not off[~best].any() and s_got[best] > s_got[~best].max(initial=0)
        raised += int(off.any())
    assert raised < 0.1 * len(lens)
    # so the rebuilt argmax is always the teacher's
    assert np.array_equal(got_idx[np.arange(len(lens)), got_val.argmax(1)],
                          logits.argmax(-1).numpy())
    q = teacher_log_probs(torch.from_numpy(got_idx), torch.from_numpy(got_val), num_classes,
                          fill=-1e4)
    kl = float((q.exp() * (q - torch.log_softmax(logits, -1))).sum(-1).sum())
    f = fidelity(logits, ks=(20,), mass=0.95, code="sqrt31")[20]
    assert f["kl_sum"] == pytest.approx(kl, rel=1e-4)
    assert f["argmax_agree_sum"] == len(lens)
    # coarser levels cost KL; the fp16 layout costs only the dropped mass
    coarse = fidelity(logits, ks=(20,), mass=0.95, code="sqrt3")[20]["kl_sum"]
    fp16 = fidelity(logits, ks=(20,), mass=0.95)[20]["kl_sum"]
    assert fp16 < f["kl_sum"] < coarse


def test_sqrt_code_rows_are_checked():
    logits = torch.randn(4, 10)
    row = records.encode_topk(*topk(logits, 3, "sqrt7"), None, "sqrt7", 10)
    assert records.decode_topk(row)[0].shape == (4, 3)
    with pytest.raises(ValueError, match="level 0"):
        records.decode_topk(dict(row, topk_logit=np.concatenate([[np.uint8(0)],
                                                                  row["topk_logit"][1:]])))
    for bad_code in ("sqrt300-u8", "sqrt1", "int8"):
        with pytest.raises(ValueError, match="unknown top-k code"):
            records.decode_topk(dict(row, topk_code=bad_code))
    with pytest.raises(ValueError, match="top-k indices"):
        records.decode_topk(dict(row, topk_idx=row["topk_idx"][:-1]))
