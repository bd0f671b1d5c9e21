"""alignment/lda_mllt.py: splicing, LDA and MLLT on data whose answer is known."""
import numpy as np

from alignment.lda_mllt import ClassStats, lda, mllt, objective, splice


def test_splice_stacks_neighbours_and_repeats_the_edges():
    x = np.arange(8.0).reshape(4, 2)
    y = splice(x, 1)
    assert y.shape == (4, 6)
    np.testing.assert_array_equal(y[0], [0, 1, 0, 1, 2, 3])
    np.testing.assert_array_equal(y[3], [4, 5, 6, 7, 6, 7])
    np.testing.assert_array_equal(splice(x, 0), x)


def _classes(seed=0, n=6000, classes=6, dim=8):
    """Classes apart in 2 of `dim` directions, noise mixed across all of them."""
    rng = np.random.default_rng(seed)
    c = rng.integers(0, classes, n)
    means = rng.normal(size=(classes, dim)) * np.r_[4.0, 4.0, np.zeros(dim - 2)]
    mix = rng.normal(size=(dim, dim))
    return means[c] + rng.normal(size=(n, dim)) @ mix.T, c, mix


def test_lda_whitens_the_within_class_scatter_and_keeps_the_class_directions():
    x, c, _ = _classes()
    stats = ClassStats.of(x, c, 6, per_class=False)
    a = lda(stats, 2)
    y = x @ a.T
    within = sum(np.cov(y[c == k].T, bias=True) * np.sum(c == k) for k in range(6)) / len(x)
    # the identity up to the ridge lda() adds to the within-class scatter (1e-6 x mean)
    np.testing.assert_allclose(within, np.eye(2), atol=1e-4)
    # the 2 kept directions hold (nearly) all the separation: a nearest-mean classifier
    # in 2 dimensions does as well as in all 8
    def accuracy(z):
        means = np.stack([z[c == k].mean(0) for k in range(6)])
        return np.mean(np.argmin(((z[:, None] - means[None]) ** 2).sum(-1), 1) == c)
    assert accuracy(y) > 0.95 * accuracy(x)


def test_summed_shard_statistics_equal_the_whole():
    x, c, _ = _classes()
    whole = ClassStats.of(x, c, 6, per_class=True)
    half = ClassStats.of(x[:2500], c[:2500], 6, True).add(ClassStats.of(x[2500:], c[2500:], 6, True))
    for a, b in ((whole.count, half.count), (whole.total, half.total),
                 (whole.scatter, half.scatter)):
        np.testing.assert_allclose(a, b, rtol=1e-10)


def test_mllt_diagonalises_a_shared_full_covariance():
    # every class shares one correlated covariance: the MLLT that fits diagonal Gaussians
    # is one that decorrelates it, and the diagonal likelihood only improves
    x, c, mix = _classes(seed=1)
    stats = ClassStats.of(x, c, 6, per_class=True)
    h = mllt(stats, iters=20)
    assert objective(stats, h) > objective(stats, np.eye(8)) + 0.5
    y = x @ h.T
    cov = np.cov((y - np.stack([y[c == k].mean(0) for k in range(6)])[c]).T)
    off = cov - np.diag(np.diag(cov))
    assert np.abs(off).max() < 0.02 * np.diag(cov).max()
    assert np.isfinite(h).all()
