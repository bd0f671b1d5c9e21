"""The batched numpy fbank matches kaldi-native-fbank; CMN and LFR pure cores."""
from __future__ import annotations

import numpy as np
import pytest

from core.config import FeaturesConfig


def _speechlike(rng, n: int, rate: int = 16000) -> np.ndarray:
    t = np.arange(n) / rate
    f0 = rng.uniform(90, 250)
    x = 0.02 * rng.standard_normal(n)
    for h in range(1, 12):
        x += (0.15 / h) * np.sin(2 * np.pi * f0 * h * t + rng.uniform(0, 6.28))
    x *= 0.3 + np.abs(np.sin(2 * np.pi * 3 * t))
    return np.clip(x, -1, 1).astype(np.float32)


@pytest.mark.parametrize("opts", [{}, {"snip_edges": False}, {"num_mel_bins": 80},
                                  {"window_type": "hamming", "preemph_coeff": 0.0},
                                  {"fft_engine": "scipy"}, {"fft_engine": "scipy", "snip_edges": False},
                                  {"remove_dc_offset": False, "low_freq": 60,
                                   "high_freq": -400}])
def test_numpy_fbank_matches_kaldi_native_fbank(opts):
    from tasks.fbank import FbankComputer, kaldi_fbank

    fcfg = FeaturesConfig(**opts)
    rng = np.random.default_rng(0)
    lengths = [400, 401, 560, 1234, 16000, 23457, 40000]
    waves = [_speechlike(rng, n) for n in lengths]
    waves.append((0.01 * rng.standard_normal(8000) + 0.2).astype(np.float32))  # DC offset
    waves.append(np.zeros(100, np.float32))  # shorter than a frame
    ours = FbankComputer(fcfg, chunk_frames=128).compute(waves)  # many chunk boundaries
    worst = 0.0
    for w, o in zip(waves, ours):
        ref = kaldi_fbank(w, fcfg)
        assert o.shape == ref.shape
        if ref.size:
            worst = max(worst, float(np.abs(o - ref).max()))
    assert worst <= 1e-3, worst


def test_kaldi_backend_dispatch_and_batching_is_order_free():
    from tasks.fbank import fbank

    rng = np.random.default_rng(1)
    waves = [_speechlike(rng, n) for n in (3000, 16000, 5000)]
    a = fbank(waves, FeaturesConfig(backend="numpy"))
    b = fbank(waves, FeaturesConfig(backend="kaldi"))
    c = fbank(waves[::-1], FeaturesConfig(backend="numpy"))[::-1]
    for x, y, z in zip(a, b, c):
        assert np.abs(x - y).max() <= 1e-3
        assert np.array_equal(x, z)


def test_stream_cmn_rule_and_chunking():
    from tasks.features import StreamCMN

    rng = np.random.default_rng(2)
    x = rng.standard_normal((1500, 4)).astype(np.float32) + np.linspace(0, 5, 1500)[:, None]
    W, M = 600, 100
    full = StreamCMN(4, W, M).apply(x)
    # the documented rule, frame by frame
    ref = np.empty_like(x)
    for t in range(len(x)):
        if t + 1 < M:
            m = x[:M].mean(0)
        else:
            m = x[max(0, t - W + 1): t + 1].mean(0)
        ref[t] = x[t] - m
    assert np.abs(full - ref).max() < 1e-4
    # carried state: any chunking after the first min_window frames gives the same result
    cmn = StreamCMN(4, W, M)
    parts = [cmn.apply(x[a:b]) for a, b in [(0, 150), (150, 151), (151, 900), (900, 1500)]]
    assert np.abs(np.concatenate(parts) - full).max() < 1e-4


def test_stack_frames_and_shift_offset():
    from core.records import shift_offset
    from tasks.features import stack_frames

    x = np.arange(20 * 2, dtype=np.float32).reshape(20, 2)
    s = stack_frames(x, 3, 3)
    assert s.shape == (6, 6)
    assert np.array_equal(s[1], np.concatenate([x[3], x[4], x[5]]))
    o1 = shift_offset(s, 1, 3)
    assert np.array_equal(o1[0], np.concatenate([x[1], x[2], x[3]]))
    assert stack_frames(x[:2], 3, 3).shape == (0, 6)
    s2 = stack_frames(x, 3, 2)
    assert s2.shape == (9, 6) and np.array_equal(s2[1], x[2:5].reshape(-1))


def test_featurize_stream_shapes():
    from tasks.features import featurize_stream

    rng = np.random.default_rng(3)
    waves = [_speechlike(rng, n) for n in (16000, 8000, 300)]
    out = featurize_stream(waves, FeaturesConfig())
    assert [o.shape for o in out] == [(32, 192), (16, 192), (0, 192)]  # 98, 48, 0 frames
    assert all(o.dtype == np.float32 for o in out)


def test_frame_labels_coverage():
    from tasks.alignments import UNK, build_inventory, frame_labels, read_ctm

    ctm = "u1 1 0.00 0.50 a\nu1 1 0.50 0.52 b\nu2 1 0.0 0.3 zz\nu3 1 x 0.1 a\nu3 1 0 0.1 a\n"
    ali, errors = read_ctm(ctm)
    assert set(ali) == {"u1", "u2"} and errors and errors[0][1] == "u3"
    inv = build_inventory(["a", "b"], ali)
    assert inv == ["a", "b", UNK]
    ids = {p: i for i, p in enumerate(inv)}
    fcfg = FeaturesConfig()
    lab, reason, _ = frame_labels(ali["u1"], 100, ids, fcfg)  # 1.015 s of audio
    assert reason is None and lab.dtype == np.int16
    assert lab[0] == 0 and lab[60] == 1 and lab[-1] == 1
    lab, reason, detail = frame_labels(ali["u1"], 300, ids, fcfg)  # 3 s: not covered
    assert lab is None and reason == "alignment_mismatch" and "tolerance" in detail
    lab, reason, _ = frame_labels(ali["u2"], 20, ids, fcfg)
    assert reason is None and set(lab.tolist()) == {ids[UNK]}
    lab, reason, _ = frame_labels(ali["u1"], 10, ids, fcfg)  # alignment far past the audio
    assert reason == "alignment_mismatch"


def test_encode_rows_uint8_shared_bin_ranges_roundtrip():
    from core.records import decode_feats
    from tasks.features import encode_rows

    rng = np.random.default_rng(4)
    x = (rng.standard_normal((50, 192)) * 3).astype(np.float32)
    enc = encode_rows(x, "uint8", 3)
    scale = np.frombuffer(enc["feat_scale"], np.float32)
    assert np.array_equal(scale[:64], scale[64:128]) and np.array_equal(scale[:64], scale[128:])
    err = np.abs(decode_feats(enc) - x)
    assert (err <= scale / 2 + 1e-5).all()
    f16 = encode_rows(x, "float16", 3)
    assert np.abs(decode_feats(f16) - x).max() < 1e-2
    assert encode_rows(x[:0], "uint8", 3)["num_frames"] == 0
