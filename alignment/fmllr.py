"""Per-speaker fMLLR (constrained MLLR) transforms for speaker-adaptive training, written
by hand: kaldi-hmm-gmm's Python API has no gmm-est-fmllr (Kaldi's train_sat.sh, tri3b).

A speaker's transform W = [A b] maps its features x to A x + b, the space the model's
diagonal Gaussians were trained in. Given Gaussian posteriors gamma (from the alignment:
each frame's pdf, the pdf's mixture), W maximises

    beta log|det A| + sum_i (w_i k_i - 1/2 w_i G_i w_i^T)

with, over frames t and Gaussians m, x~ = [x; 1]:
    beta = sum gamma,  k_i = sum gamma mu_mi / var_mi x~,  G_i = sum gamma / var_mi x~ x~^T.
Gales (1998) updates one row at a time in closed form; every row update raises the
objective, so a few passes over the rows converge.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class FmllrStats:
    """One speaker's sufficient statistics (float64)."""
    beta: float
    k: np.ndarray   # [D, D+1]
    g: np.ndarray   # [D, D+1, D+1]

    def add(self, other: "FmllrStats") -> "FmllrStats":
        """Sums into fresh arrays (another shard's may be read-only: Ray's object store)."""
        return FmllrStats(self.beta + other.beta, self.k + other.k, self.g + other.g)


@dataclass
class PdfGaussians:
    """A pdf's mixture in the form Kaldi scores it: log N(x; m) =
    gconst_m + means_invvars_m . x - 1/2 inv_vars_m . x^2 (weights inside gconst)."""
    gconsts: np.ndarray        # [M]
    means_invvars: np.ndarray  # [M, D]
    inv_vars: np.ndarray       # [M, D]

    @classmethod
    def of(cls, pdf) -> "PdfGaussians":
        """From a kaldi_hmm_gmm DiagGmm."""
        return cls(np.asarray(pdf.gconsts, np.float64), np.asarray(pdf.means_invvars, np.float64),
                   np.asarray(pdf.inv_vars, np.float64))


def accumulate(raw: np.ndarray, seen: np.ndarray, pdfs: np.ndarray,
               gaussians: list[PdfGaussians]) -> FmllrStats:
    """Statistics of one speaker's frames: `raw` [T, D] the features W will map, `seen`
    [T, D] the features the model scores now (for the posteriors), `pdfs` [T] each frame's
    aligned pdf."""
    dim = raw.shape[1]
    a = np.zeros((len(raw), dim))   # sum_m gamma / var_m      per frame
    b = np.zeros((len(raw), dim))   # sum_m gamma mu_m / var_m per frame
    for j in np.unique(pdfs):
        rows = np.flatnonzero(pdfs == j)
        x, g = seen[rows].astype(np.float64), gaussians[j]
        ll = g.gconsts + x @ g.means_invvars.T - 0.5 * (x * x) @ g.inv_vars.T
        post = np.exp(ll - ll.max(1, keepdims=True))
        post /= post.sum(1, keepdims=True)
        a[rows], b[rows] = post @ g.inv_vars, post @ g.means_invvars
    ext = np.hstack([raw.astype(np.float64), np.ones((len(raw), 1))])
    gram = np.stack([(ext * a[:, i, None]).T @ ext for i in range(dim)])
    return FmllrStats(float(len(raw)), b.T @ ext, gram)


def identity(dim: int) -> np.ndarray:
    """[D, D+1]: the transform that changes nothing."""
    return np.hstack([np.eye(dim), np.zeros((dim, 1))])


def objective(stats: FmllrStats, w: np.ndarray) -> float:
    """The auxiliary function per frame (up to a constant)."""
    quad = np.einsum("ij,ijk,ik->", w, stats.g, w)
    _, logdet = np.linalg.slogdet(w[:, :-1])
    return float((stats.beta * logdet + np.sum(w * stats.k) - 0.5 * quad) / stats.beta)


def estimate(stats: FmllrStats, w0: np.ndarray | None = None, passes: int = 10) -> np.ndarray:
    """[D, D+1] W maximising the objective, from w0 (default: the identity), row by row."""
    dim = stats.k.shape[0]
    w = identity(dim) if w0 is None else np.array(w0, np.float64)
    for _ in range(passes):
        for i in range(dim):
            a = w[:, :-1]
            cof = np.append(np.linalg.det(a) * np.linalg.inv(a).T[i], 0.0)  # cofactor row i
            g_inv_p = np.linalg.solve(stats.g[i], cof)
            g_inv_k = np.linalg.solve(stats.g[i], stats.k[i])
            e1, e2 = cof @ g_inv_p, cof @ g_inv_k
            # alpha^2 e1 + alpha e2 - beta = 0; take the root with the larger objective,
            # beta log|alpha e1 + e2| - 1/2 alpha^2 e1
            disc = np.sqrt(e2 * e2 + 4.0 * e1 * stats.beta)
            roots = [(-e2 + disc) / (2 * e1), (-e2 - disc) / (2 * e1)]
            alpha = max(roots, key=lambda r: stats.beta * np.log(abs(r * e1 + e2))
                        - 0.5 * r * r * e1)
            w[i] = alpha * g_inv_p + g_inv_k
    return w


def apply(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """A x + b for every frame of x [T, D]."""
    return (x @ w[:, :-1].T + w[:, -1]).astype(np.float32)
