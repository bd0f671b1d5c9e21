"""LDA + MLLT feature transforms (Kaldi's train_lda_mllt.sh), written by hand: kaldi-hmm-gmm's
Python API has neither est-lda nor est-mllt.

Features: the per-speaker-normalised static MFCCs spliced over +-`context` frames, projected
by LDA to `dim` dimensions (classes: the previous model's pdfs on its alignment, silence
frames left out as Kaldi's recipe does with weight-silence-post 0), then rotated by an MLLT
(a semi-tied covariance, Gales 1999) so that diagonal Gaussians fit them. The MLLT is
estimated once, from the full covariance of every pdf in the LDA space (one Gaussian per
pdf); Kaldi re-estimates it from the GMMs' Gaussians at several iterations of training.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg


def edge_pad(x: np.ndarray, context: int) -> np.ndarray:
    """[T, D] -> [T + 2 context, D]: the first and last frames repeated `context` times."""
    return np.concatenate([np.repeat(x[:1], context, 0), x, np.repeat(x[-1:], context, 0)])


def splice(x: np.ndarray, context: int) -> np.ndarray:
    """[T, D] -> [T, D * (2 context + 1)]: each frame with its neighbours, edges repeated."""
    if context == 0 or len(x) == 0:
        return x
    padded = edge_pad(x, context)
    return np.concatenate([padded[i:i + len(x)] for i in range(2 * context + 1)], axis=1)


@dataclass
class ClassStats:
    """Per class: frames, sum of features, and either the classes' summed second moment
    (`scatter` [D, D]: enough for LDA) or each class's own (`scatter` [C, D, D]: MLLT)."""
    count: np.ndarray      # [C]
    total: np.ndarray      # [C, D]
    scatter: np.ndarray    # [D, D] or [C, D, D]

    @classmethod
    def of(cls, feats: np.ndarray, classes: np.ndarray, num_classes: int,
           per_class: bool) -> "ClassStats":
        x = feats.astype(np.float64)
        count = np.bincount(classes, minlength=num_classes).astype(np.float64)
        total = np.zeros((num_classes, x.shape[1]))
        np.add.at(total, classes, x)
        if not per_class:
            return cls(count, total, x.T @ x)
        scatter = np.zeros((num_classes, x.shape[1], x.shape[1]))
        for c in np.unique(classes):
            xc = x[classes == c]
            scatter[c] = xc.T @ xc
        return cls(count, total, scatter)

    def add(self, other: "ClassStats") -> "ClassStats":
        """Sums into fresh arrays (another shard's may be read-only: Ray's object store)."""
        return ClassStats(self.count + other.count, self.total + other.total,
                          self.scatter + other.scatter)


def lda(stats: ClassStats, dim: int) -> np.ndarray:
    """[dim, D]: the directions of most between-class over within-class variance, scaled
    so that the within-class covariance becomes the identity (est-lda)."""
    n = stats.count.sum()
    mean = stats.total.sum(0) / n
    seen = stats.count > 0
    means = stats.total[seen] / stats.count[seen, None]
    between = (stats.count[seen, None, None] * means[:, :, None] * means[:, None, :]).sum(0) / n
    between -= np.outer(mean, mean)
    within = stats.scatter / n - between - np.outer(mean, mean)
    within += np.eye(len(within)) * 1e-6 * np.trace(within) / len(within)
    values, vectors = scipy.linalg.eigh(between, within)  # vectors' W-norm is 1
    top = np.argsort(values)[::-1][:dim]
    return vectors[:, top].T


def _covariances(stats: ClassStats) -> tuple[np.ndarray, np.ndarray]:
    """(frames [C'], full covariance [C', D, D]) of the classes seen more than once
    (per-class statistics)."""
    seen = stats.count > 1
    n = stats.count[seen]
    means = stats.total[seen] / n[:, None]
    return n, stats.scatter[seen] / n[:, None, None] - means[:, :, None] * means[:, None, :]


def mllt(stats: ClassStats, iters: int = 10) -> np.ndarray:
    """[D, D] square transform H maximising the likelihood of diagonal Gaussians (one per
    class) on H x: Gales' row-by-row semi-tied covariance update."""
    n, cov = _covariances(stats)
    beta = n.sum()
    d = cov.shape[1]
    h = np.eye(d)
    for _ in range(iters):
        for i in range(d):
            var = np.einsum("j,cjk,k->c", h[i], cov, h[i])            # h_i C_c h_i^T
            g = np.einsum("c,cjk->jk", n / np.maximum(var, 1e-10), cov)
            cof = np.linalg.det(h) * np.linalg.inv(h).T[i]           # cofactor row i
            g_inv_c = np.linalg.solve(g, cof)
            h[i] = g_inv_c * np.sqrt(beta / (cof @ g_inv_c))
    return h


def objective(stats: ClassStats, h: np.ndarray) -> float:
    """Average log-likelihood gain terms of diagonal Gaussians on H x (up to a constant):
    log |det H| - 0.5 sum_c n_c log prod diag(H C_c H^T) / N."""
    n, cov = _covariances(stats)
    diag = np.einsum("ij,cjk,ik->ci", h, cov, h)
    return float(np.log(abs(np.linalg.det(h))) - 0.5 * (n[:, None] * np.log(diag)).sum() / n.sum())
