"""WER confidence intervals and matched-pairs tests on small hand-made inputs."""
import math

import numpy as np
import pytest

from decoding import significance as S


def test_mapsswe_hand_computed():
    # d = [1, 2, 0, 1, 1]: mean 1, sample sd sqrt(0.5), z = 1 / (sqrt(.5)/sqrt(5)) = sqrt(10)
    r = S.mapsswe([3, 4, 1, 2, 2], [2, 2, 1, 1, 1])
    assert r["z"] == pytest.approx(math.sqrt(10))
    assert r["p"] == pytest.approx(math.erfc(math.sqrt(10) / math.sqrt(2)))
    assert r["p"] < 0.01


def test_mapsswe_identical_systems_not_significant():
    r = S.mapsswe([1, 0, 2], [1, 0, 2])
    assert r["p"] == 1.0 and r["z"] == 0.0


def test_bootstrap_ci_contains_wer_and_covers_truth():
    rng = np.random.default_rng(1)
    true_wer, hits, trials = 0.2, 0, 40
    for t in range(trials):
        words = rng.integers(5, 15, size=100)
        errors = rng.binomial(words, true_wer)
        lo, hi = S.bootstrap_ci(errors, words, n_boot=400, seed=t)
        assert lo <= errors.sum() / words.sum() <= hi
        hits += lo <= true_wer <= hi
    assert hits >= 0.85 * trials  # nominal 95 %; loose bound for 40 trials


def test_bootstrap_ci_by_group_is_wider_for_correlated_speakers():
    # two speakers: one perfect, one all wrong -> resampling speakers swings WER 0..1
    errors, words = [0] * 10 + [5] * 10, [5] * 20
    groups = ["a"] * 10 + ["b"] * 10
    lo_u, hi_u = S.bootstrap_ci(errors, words)
    lo_g, hi_g = S.bootstrap_ci(errors, words, groups=groups)
    assert hi_g - lo_g > hi_u - lo_u
    assert lo_g == 0.0 and hi_g == 1.0


def test_paired_bootstrap_and_compare_rows():
    a = [{"utt_id": f"u{i}", "errors": 3, "ref_words": 10} for i in range(30)]
    b = [{"utt_id": f"u{i}", "errors": 1, "ref_words": 10} for i in range(30)]
    b.append({"utt_id": "extra", "errors": 0, "ref_words": 5})
    r = S.compare_rows(a, b)
    assert r["utterances"] == 30 and r["only_b"] == 1
    assert r["wer_a"] == pytest.approx(0.3) and r["wer_b"] == pytest.approx(0.1)
    assert r["significant"] and r["p_bootstrap"] == 0.0
    # a noisy tie: not significant
    c = [{"utt_id": f"u{i}", "errors": e, "ref_words": 10} for i, e in enumerate([3, 2] * 15)]
    d = [{"utt_id": f"u{i}", "errors": e, "ref_words": 10} for i, e in enumerate([2, 3] * 15)]
    r2 = S.compare_rows(c, d)
    assert not r2["significant"] and r2["p_mapsswe"] >= 0.05 and r2["p_bootstrap"] >= 0.05


def test_length_mismatch_is_an_error():
    with pytest.raises(ValueError):
        S.bootstrap_ci([1, 2], [3])
