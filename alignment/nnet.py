"""A full-rate alignment network (Kaldi's nnet alignments, hybrid DNN-HMM): a frame classifier
over the final GMM model's pdfs, trained on its alignments, whose scaled likelihoods
(log posterior - log prior) replace the GMMs' in Viterbi realignment.

Cross-fitted: with `folds` = 2 each utterance is realigned by a network trained on the other
half, since a network realigning its own training data reproduces the alignment it learned
(measured: one network on all utterances moved frames by +0.04 points). It runs at the
aligner's 10 ms frames. The pipeline's own network emits every 30 ms, which
caps what realignment with it could reach (README.md); this one is small, trained here in
a minute, and used for nothing but alignment. Written by hand: kaldi-hmm-gmm has no
neural network; its `DecodableCtc` takes the scaled log-likelihood matrix (column i - 1
for transition id i), which is how the graphs are searched with it.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from alignment.lda_mllt import edge_pad


@dataclass
class NnetOptions:
    rounds: int = 0          # train + realign rounds (0: off)
    context: int = 5         # +-frames of input each frame sees
    hidden: int = 512
    layers: int = 3
    epochs: int = 4
    acoustic_scale: float = 0.1
    folds: int = 2           # each utterance realigned by a network that did not train on it
    seed: int = 0


def fold_of(utt_id: str, folds: int) -> int:
    """A stable fold per utterance (the same on every job and every run)."""
    return zlib.crc32(utt_id.encode()) % folds if folds > 1 else 0


class FrameNet(nn.Module):
    """[B, 2 context + 1, D] spliced frames -> [B, num_pdfs] logits."""

    def __init__(self, dim: int, context: int, hidden: int, layers: int, num_pdfs: int):
        super().__init__()
        self.context = context
        sizes = [dim * (2 * context + 1)] + [hidden] * layers
        body: list[nn.Module] = []
        for a, b in zip(sizes, sizes[1:]):
            body += [nn.Linear(a, b), nn.ReLU(), nn.LayerNorm(b)]
        self.body = nn.Sequential(*body, nn.Linear(sizes[-1], num_pdfs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x.flatten(1))


class Frames:
    """Utterances' features edge-padded by `context` and concatenated once, so a batch of
    spliced frames is one gather (no copy of every frame's neighbours)."""

    def __init__(self, feats: list[np.ndarray], context: int):
        pad = [edge_pad(f, context) for f in feats]
        starts = np.cumsum([0] + [len(p) for p in pad[:-1]])
        self.x = torch.from_numpy(np.concatenate(pad).astype(np.float32))
        self.centre = torch.from_numpy(np.concatenate(
            [s + context + np.arange(len(f)) for s, f in zip(starts, feats)]))
        self.offsets = torch.arange(-context, context + 1)

    def __len__(self) -> int:
        return len(self.centre)

    def batch(self, rows: torch.Tensor) -> torch.Tensor:
        return self.x[self.centre[rows, None] + self.offsets]


def train(feats: list[np.ndarray], labels: list[np.ndarray], num_pdfs: int,
          opts: NnetOptions, batch: int = 512) -> tuple[FrameNet, np.ndarray, list[float]]:
    """(network, log priors of the pdfs, mean cross-entropy per epoch)."""
    torch.manual_seed(opts.seed)
    frames = Frames(feats, opts.context)
    y = torch.from_numpy(np.concatenate(labels).astype(np.int64))
    net = FrameNet(feats[0].shape[1], opts.context, opts.hidden, opts.layers, num_pdfs)
    optim = torch.optim.Adam(net.parameters(), lr=1e-3)
    steps = opts.epochs * ((len(y) + batch - 1) // batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(optim, max_lr=2e-3, total_steps=steps)
    gen = torch.Generator().manual_seed(opts.seed)
    losses = []
    for _ in range(opts.epochs):
        total = 0.0
        for rows in torch.randperm(len(y), generator=gen).split(batch):
            loss = nn.functional.cross_entropy(net(frames.batch(rows)), y[rows])
            optim.zero_grad()
            loss.backward()
            optim.step()
            sched.step()
            total += float(loss.detach()) * len(rows)
        losses.append(total / len(y))
    counts = np.bincount(y.numpy(), minlength=num_pdfs).astype(np.float64) + 1.0
    return net.eval(), np.log(counts / counts.sum()), losses


@torch.inference_mode()
def scaled_loglikes(net: FrameNet, feats: np.ndarray, log_priors: np.ndarray,
                    pdf_of_tid: np.ndarray, scale: float) -> np.ndarray:
    """[T, num transition ids] float32: scale x (log p(pdf | x) - log p(pdf)) of each
    transition id's pdf, column i - 1 for transition id i (DecodableCtc's layout)."""
    frames = Frames([feats], net.context)
    logp = torch.log_softmax(net(frames.batch(torch.arange(len(frames)))), -1).numpy()
    return (scale * (logp - log_priors)[:, pdf_of_tid[1:]]).astype(np.float32)
