"""alignment/nnet.py: the full-rate alignment network's data layout, training and output."""
import numpy as np
import torch

from alignment import nnet
from alignment.lda_mllt import splice


def test_frames_gather_equals_splicing_each_utterance():
    rng = np.random.default_rng(0)
    feats = [rng.standard_normal((n, 3)).astype(np.float32) for n in (1, 5, 2)]
    frames = nnet.Frames(feats, context=2)
    assert len(frames) == 8
    got = frames.batch(torch.arange(8)).flatten(1).numpy()
    np.testing.assert_array_equal(got, np.concatenate([splice(f, 2) for f in feats]))


def test_training_learns_separable_frames_and_priors_follow_the_counts():
    rng = np.random.default_rng(1)
    labels = [rng.integers(0, 4, 300) for _ in range(4)]
    feats = [(np.eye(4)[y] * 3 + rng.standard_normal((len(y), 4)) * 0.3).astype(np.float32)
             for y in labels]
    opts = nnet.NnetOptions(rounds=1, context=1, hidden=32, layers=2, epochs=10)
    net, log_priors, losses = nnet.train(feats, labels, 5, opts, batch=64)
    assert losses[-1] < 0.2 < losses[0]
    counts = np.bincount(np.concatenate(labels), minlength=5) + 1.0
    np.testing.assert_allclose(np.exp(log_priors), counts / counts.sum())
    again, _, losses2 = nnet.train(feats, labels, 5, opts, batch=64)
    assert losses2 == losses  # seeded: the same network twice


def test_scaled_loglikes_put_transition_i_in_column_i_minus_1():
    torch.manual_seed(0)
    net = nnet.FrameNet(dim=3, context=1, hidden=8, layers=1, num_pdfs=2).eval()
    x = np.random.default_rng(2).standard_normal((6, 3)).astype(np.float32)
    pdf_of_tid = np.array([0, 1, 0, 0, 1])  # transition ids 1..4 -> pdfs 1, 0, 0, 1
    priors = np.log(np.array([0.25, 0.75]))
    out = nnet.scaled_loglikes(net, x, priors, pdf_of_tid, scale=0.1)
    assert out.shape == (6, 4) and out.dtype == np.float32
    with torch.no_grad():
        logp = torch.log_softmax(net(nnet.Frames([x], 1).batch(torch.arange(6))), -1).numpy()
    np.testing.assert_allclose(out[:, 0], 0.1 * (logp[:, 1] - priors[1]), rtol=1e-5)
    np.testing.assert_allclose(out[:, 1], out[:, 2])
