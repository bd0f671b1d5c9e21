"""alignment/fmllr.py: per-speaker fMLLR transforms recover a known affine distortion."""
from __future__ import annotations

import numpy as np
import pytest

from alignment import fmllr


def _model(rng, pdfs: int = 5, mix: int = 3, dim: int = 6) -> list[dict]:
    return [{"w": np.full(mix, 1.0 / mix), "mu": rng.normal(0, 3, (mix, dim)),
             "var": rng.uniform(0.3, 1.5, (mix, dim))} for _ in range(pdfs)]


def _gaussians(model: list[dict]) -> list[fmllr.PdfGaussians]:
    out = []
    for p in model:
        iv = 1.0 / p["var"]
        gc = (np.log(p["w"]) - 0.5 * np.sum(np.log(2 * np.pi * p["var"]) + p["mu"] ** 2 * iv, 1))
        out.append(fmllr.PdfGaussians(gc, p["mu"] * iv, iv))
    return out


def _speaker(rng, model, frames: int, dim: int = 6):
    """Frames drawn from the model, then distorted by x = C z + c: fMLLR's answer is
    W = [C^-1, -C^-1 c]."""
    pdfs = rng.integers(0, len(model), frames)
    z = np.empty((frames, dim))
    for t, j in enumerate(pdfs):
        m = rng.integers(0, len(model[j]["w"]))
        z[t] = model[j]["mu"][m] + rng.standard_normal(dim) * np.sqrt(model[j]["var"][m])
    c = np.eye(dim) + rng.normal(0, 0.15, (dim, dim))
    shift = rng.normal(0, 1.0, dim)
    inv = np.linalg.inv(c)
    return z @ c.T + shift, pdfs, np.hstack([inv, -(inv @ shift)[:, None]])


def test_estimate_recovers_the_inverse_of_a_speakers_distortion():
    rng = np.random.default_rng(0)
    model = _model(rng)
    x, pdfs, truth = _speaker(rng, model, 20000)
    gs = _gaussians(model)
    w = None
    for _ in range(4):  # as SAT does: posteriors under the current transform, re-estimate
        seen = x if w is None else fmllr.apply(w, x)
        stats = fmllr.accumulate(x, seen, pdfs, gs)
        w = fmllr.estimate(stats, w)
    assert np.abs(w - truth).max() < 0.05, np.abs(w - truth).max()
    assert fmllr.objective(stats, w) > fmllr.objective(stats, fmllr.identity(6)) + 0.1


def test_every_pass_raises_the_objective_and_stats_add_up():
    rng = np.random.default_rng(1)
    model = _model(rng)
    x, pdfs, _ = _speaker(rng, model, 3000)
    gs = _gaussians(model)
    stats = fmllr.accumulate(x, x, pdfs, gs)
    values, w = [], None
    for _ in range(5):
        w = fmllr.estimate(stats, w, passes=1)
        values.append(fmllr.objective(stats, w))
    assert all(b >= a - 1e-9 for a, b in zip(values, values[1:])), values
    half = fmllr.accumulate(x[:1500], x[:1500], pdfs[:1500], gs).add(
        fmllr.accumulate(x[1500:], x[1500:], pdfs[1500:], gs))
    assert half.beta == stats.beta
    np.testing.assert_allclose(half.g, stats.g, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(half.k, stats.k, rtol=1e-9, atol=1e-9)


def test_gaussian_terms_match_kaldis_own_scores():
    """PdfGaussians.of reads a DiagGmm so that its log-likelihoods are Kaldi's."""
    khg = pytest.importorskip("kaldi_hmm_gmm")
    rng = np.random.default_rng(2)
    g = khg.DiagGmm(nmix=3, dim=4)
    g.set_weights(np.array([0.2, 0.5, 0.3], np.float32))
    g.set_means(rng.normal(0, 1, (3, 4)).astype(np.float32))
    g.set_invvars(rng.uniform(0.5, 2, (3, 4)).astype(np.float32))
    g.compute_gconsts()
    x = rng.normal(0, 1, 4).astype(np.float32)
    p = fmllr.PdfGaussians.of(g)
    ll = p.gconsts + p.means_invvars @ x - 0.5 * p.inv_vars @ (x * x)
    np.testing.assert_allclose(ll, np.asarray(g.log_likelihoods(x)), rtol=1e-4, atol=1e-3)
