"""Lattice-free sequence-discriminative training: LF-MMI with a phone n-gram denominator.

The petabyte paper ends every recipe with sMBR over lattices. No lattice forward-backward
is callable from Python here (shared notes, decoding-stack.md), so this module follows
the lattice-free route of Povey et al. 2016 ("Purely sequence-trained neural networks for
ASR based on lattice-free MMI", LF-MMI): the competing hypotheses are every path through
a small phone-level graph, summed exactly by a batched forward-backward in torch.

Pieces, each usable on its own:

- `estimate_phone_ngram(label_seqs, num_phones, order, min_count)`: a phone n-gram
  (interpolated absolute discounting) from the labeled split's frame labels, collapsed
  into phone sequences, plus per-phone self-loop probabilities (the ML geometric duration
  of each phone). Repeats are impossible: a collapsed sequence never repeats a phone.
- `denominator_graph(lm)`: the n-gram composed with a 1-state-per-phone HMM with
  self-loop (the topology the decoder uses) as an epsilon-free `Graph`. Every n-gram
  state except the start has a unique last phone; the state is the HMM state of that phone.
- `chunk_graph(graph)`: LF-MMI's trick for training on chunks (§2.4 of the paper): the
  initial weights become the state distribution averaged over 100 steps of running the
  graph from its start, and every state is final.
- `numerator_graphs(phones, num_phones_per_seq, loop_logprob)`: each utterance's phone
  sequence with flexible timing (left to right, >= 1 frame per phone, self-loops),
  batched with padding. The fixed alignment needs no graph (`alignment_logprob`).
- `log_partition(x, lengths, graph, leaky)`: log of the summed weight of all paths, per
  sequence, for log-likelihoods x [B, T, C]; its gradient is the occupation posterior of
  each class at each frame (a custom autograd.Function; the backward pass is the
  beta recursion, so no arc-level tensors are kept per frame).
- `mmi_loss(logits, labels, den, ...)`: the MMI objective per frame, with CE interpolation
  and output L2 (LF-MMI §2.6), and a `NonFiniteSequenceError` naming the utterance.
- `expected_accuracy(x, lengths, den, reward, leaky)` and `smbr_loss(...)`: lattice-free
  sMBR (Kanda et al. 2018), the expected frame accuracy over the denominator's paths.
- `SequenceCriterion`: all of it configured from `train.*`, the object a recipe calls.

Graphs are arc-emitting (as in k2): a path of T frames takes T arcs, and the arc taken at
frame t adds its weight plus x[t, label]. `Graph` tensors have a leading graph dimension G:
1 (one graph shared by the batch, the denominator) or B (one per sequence, numerators).
Forward-backward loops over time only, vectorised over the batch and the arcs, on CPU or
GPU alike. Any graph runs as a gather over arcs and a scatter log-sum-exp into states per
frame; a state-labelled graph (the denominator: every arc into a state carries that
state's phone) runs as one max-shifted [B, S] x [S, S] product per frame, 4x (bigram)
to 15x (trigram) faster on a CPU.
"""
from __future__ import annotations

import math
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from core import records
from core.config import SequenceConfig
from core.outcomes import SUCCESS, StepError
from core.storage import join
from training.losses import IGNORE, LossOut, ce_loss

NEG_INF = float("-inf")
# LF-MMI §2.4: chunk initial probabilities from 100 steps of the graph from its start.
CHUNK_WARMUP_STEPS = 100
# A phone's self-loop probability is clipped here: 0 would forbid >1-frame phones, 1
# would forbid leaving.
LOOP_RANGE = (0.05, 0.95)
# Largest graph run as a dense transition matrix (S x S floats; 4096 states = 64 MiB fp32).
DENSE_MAX_STATES = 4096


class NonFiniteSequenceError(FloatingPointError):
    """A sequence objective met a NaN or an infinity; the message names the utterance."""


# ----------------------------------------------------------------- graphs
@dataclass
class Graph:
    """A batch of arc-emitting FSAs with the same arc and state counts (padded).

    Arcs: src, dst, label [G, A] int64 and weight [G, A] (log; -inf marks a padding arc).
    initial, final [G, S] (log). G = 1 (shared) or the batch size.
    """

    num_states: int
    src: torch.Tensor
    dst: torch.Tensor
    label: torch.Tensor
    weight: torch.Tensor
    initial: torch.Tensor
    final: torch.Tensor

    # (trans [S, S] = exp(weight) at [src, dst], state_label [S]) when the graph is
    # state-labelled (see `dense_form`); False when it is not; None before the check.
    dense: tuple[torch.Tensor, torch.Tensor] | bool | None = field(default=None, repr=False,
                                                                  compare=False)
    # The transition products of the dense form on this graph's device (`_products`).
    products: tuple | None = field(default=None, repr=False, compare=False)

    @property
    def num_arcs(self) -> int:
        """Real (non-padding) arcs of the first graph."""
        return int(torch.isfinite(self.weight[0]).sum())

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> "Graph":
        dtype = dtype or self.weight.dtype
        if self.weight.device == torch.device(device) and self.weight.dtype == dtype:
            return self  # keeps what is cached on it (dense form, sparse products)
        dense = self.dense
        if isinstance(dense, tuple):
            dense = (dense[0].to(device, dtype), dense[1].to(device))
        return Graph(self.num_states, self.src.to(device), self.dst.to(device),
                     self.label.to(device), self.weight.to(device, dtype),
                     self.initial.to(device, dtype), self.final.to(device, dtype), dense)

    def dense_form(self, max_states: int = 0) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The graph as a transition matrix, when it is one shared graph (G = 1) in which
        all arcs into a state carry the same label and no two arcs join the same pair of
        states: then a frame of the forward pass is one [B, S] x [S, S] product (LF-MMI's
        denominator is such a graph: the label of a state is its HMM state's phone).
        Computed once (up to `max_states`, default DENSE_MAX_STATES) and cached."""
        if self.dense is None:
            self.dense = _densify(self, max_states or DENSE_MAX_STATES) or False
        return self.dense or None


def _densify(g: Graph, max_states: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    s = g.num_states
    if g.src.shape[0] != 1 or s > max_states:
        return None
    real = torch.isfinite(g.weight[0])
    src, dst, lab, w = g.src[0][real], g.dst[0][real], g.label[0][real], g.weight[0][real]
    if len(torch.unique(src * s + dst)) != len(src):
        return None
    lo = torch.full((s,), 1 << 62, dtype=lab.dtype, device=lab.device)
    lo = lo.scatter_reduce(0, dst, lab, "amin")
    hi = torch.full((s,), -1, dtype=lab.dtype, device=lab.device)
    hi = hi.scatter_reduce(0, dst, lab, "amax")
    entered = hi >= 0
    if bool((lo[entered] != hi[entered]).any()):
        return None
    trans = torch.zeros(s, s, dtype=g.weight.dtype, device=w.device)
    trans[src, dst] = torch.exp(w)
    return trans, torch.where(entered, hi, torch.zeros_like(hi))


def graph_from_arcs(num_states: int, arcs: Sequence[tuple[int, int, int, float]],
                    initial: dict[int, float], final: dict[int, float]) -> Graph:
    """One graph (G = 1) from (src, dst, label, log weight) arcs and log initial/final weights."""
    a = np.asarray(arcs, dtype=np.float64).reshape(-1, 4)
    init = torch.full((1, num_states), NEG_INF, dtype=torch.float64)
    fin = torch.full((1, num_states), NEG_INF, dtype=torch.float64)
    for s, w in initial.items():
        init[0, s] = w
    for s, w in final.items():
        fin[0, s] = w
    as_long = lambda col: torch.from_numpy(a[:, col].astype(np.int64))[None]  # noqa: E731
    return Graph(num_states, as_long(0), as_long(1), as_long(2),
                 torch.from_numpy(a[:, 3].copy())[None], init, fin)


# ----------------------------------------------------------------- phone n-gram
@dataclass
class PhoneNgram:
    """A phone n-gram as an epsilon-free automaton: one row per history state.

    `histories[i]` is state i's history (phone ids, BOS = num_phones); state 0 is the
    start (BOS,). `next_state[i, p]` is the state after phone p, `logprob[i, p]` is
    log P(p | history) (-inf for the repeat of the history's last phone), `log_final[i]`
    is log P(</s> | history). `loop_logprob[p]` is phone p's HMM self-loop log-probability.
    """

    order: int
    num_phones: int
    histories: list[tuple[int, ...]]
    next_state: np.ndarray  # [H, C] int64
    logprob: np.ndarray  # [H, C] float64
    log_final: np.ndarray  # [H] float64
    loop_logprob: np.ndarray  # [C] float64
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def bos(self) -> int:
        return self.num_phones

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types (saved beside a sequence-trained model, reloaded on resume)."""
        return {"order": self.order, "num_phones": self.num_phones,
                "histories": [list(h) for h in self.histories],
                "next_state": self.next_state.tolist(), "logprob": _finite(self.logprob),
                "log_final": _finite(self.log_final), "loop_logprob": self.loop_logprob.tolist(),
                "counts": dict(self.counts)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PhoneNgram":
        return cls(int(d["order"]), int(d["num_phones"]), [tuple(h) for h in d["histories"]],
                   np.asarray(d["next_state"], np.int64), _unfinite(d["logprob"]),
                   _unfinite(d["log_final"]), np.asarray(d["loop_logprob"], np.float64),
                   dict(d.get("counts", {})))


def _finite(a: np.ndarray) -> list:
    return np.where(np.isfinite(a), a, None).tolist()  # JSON has no -inf


def _unfinite(v: list) -> np.ndarray:
    return np.asarray(np.where(np.equal(np.asarray(v, object), None), NEG_INF, v), np.float64)


def collapse(labels: np.ndarray) -> np.ndarray:
    """Frame labels -> phone sequence (runs of one label become one phone)."""
    lab = np.asarray(labels)
    lab = lab[lab != IGNORE]
    if len(lab) == 0:
        return lab.astype(np.int64)
    keep = np.ones(len(lab), bool)
    keep[1:] = lab[1:] != lab[:-1]
    return lab[keep].astype(np.int64)


def _discount(counts_of_counts: Counter) -> float:
    """Absolute discount D = n1 / (n1 + 2 n2) (Ney et al. 1994), kept inside (0, 1)."""
    n1, n2 = counts_of_counts.get(1, 0), counts_of_counts.get(2, 0)
    if n1 == 0:
        return 0.5
    return min(max(n1 / (n1 + 2 * n2), 0.1), 0.9)


def estimate_phone_ngram(label_seqs: Iterable[np.ndarray], num_phones: int, order: int = 2,
                         min_count: int = 2) -> PhoneNgram:
    """A phone n-gram from frame-label sequences (one array per utterance).

    Interpolated absolute discounting down to a uniform distribution, so that every phone
    can follow every history (the denominator must contain every numerator path). Pruning:
    a history longer than one phone seen fewer than `min_count` times is not a state;
    transitions into it go to its longest kept suffix instead (LF-MMI §2.2 keeps the
    graph small the same way, by limiting the number of higher-order states).
    """
    if order < 2:
        raise ValueError(f"phone n-gram order must be >= 2 (got {order}): every state "
                         "other than the start needs a unique last phone")
    c, bos, eos = num_phones, num_phones, num_phones + 1
    ngrams: list[Counter] = [Counter() for _ in range(order)]  # by history length
    seg = np.zeros(c, np.float64)
    frames = np.zeros(c, np.float64)
    utts = phones_total = 0
    for lab in label_seqs:
        lab = np.asarray(lab)
        lab = lab[lab != IGNORE].astype(np.int64)
        if len(lab) == 0:
            continue
        if int(lab.min()) < 0 or int(lab.max()) >= c:
            raise ValueError(f"label out of range [0, {c}) in utterance {utts}")
        seq = collapse(lab)
        frames += np.bincount(lab, minlength=c)
        seg += np.bincount(seq, minlength=c)
        utts += 1
        phones_total += len(seq)
        toks = [bos] + seq.tolist() + [eos]
        for i in range(1, len(toks)):
            for n in range(min(order, i + 1)):  # history length n (BOS starts the longest)
                ngrams[n][tuple(toks[i - n:i + 1])] += 1
    if utts == 0:
        raise ValueError("no labeled frames to estimate the phone n-gram from")
    hist_counts: list[dict[tuple, np.ndarray]] = []
    for n in range(order):
        table: dict[tuple, np.ndarray] = {}
        for g, k in ngrams[n].items():
            table.setdefault(g[:-1], np.zeros(c + 2))[g[-1]] += k
        hist_counts.append(table)
    discounts = [_discount(Counter(ngrams[n].values())) for n in range(order)]
    states = _kept_histories(hist_counts, order, min_count, bos, c)
    probs = {(): _interpolated((), hist_counts, discounts, c, {})}
    for h in sorted(states, key=len):
        probs[h] = _interpolated(h, hist_counts, discounts, c, probs)
    index = {h: i for i, h in enumerate(states)}
    nxt = np.zeros((len(states), c), np.int64)
    logprob = np.full((len(states), c), NEG_INF)
    log_final = np.full(len(states), NEG_INF)
    for i, h in enumerate(states):
        p = probs[h].copy()
        if h[-1] == bos:
            p[eos] = 0.0  # an utterance has at least one frame, so one phone
        else:
            p[h[-1]] = 0.0  # no repeats: a repeat is indistinguishable from the self-loop
            log_final[i] = math.log(p[eos] / p.sum())
        p[bos] = 0.0
        p = p[:c] / p.sum()
        with np.errstate(divide="ignore"):
            logprob[i] = np.log(p)
        for q in range(c):
            nxt[i, q] = index[_next_history(h, q, index, order)]
    loops = np.clip(1.0 - seg / np.maximum(frames, 1.0), *LOOP_RANGE)
    loops[frames == 0] = 0.5  # unseen phones: a 2-frame mean duration
    return PhoneNgram(order, c, states, nxt, logprob, log_final, np.log(loops),
                      {"utterances": utts, "phones": phones_total, "frames": int(frames.sum())})


def _kept_histories(hist_counts: list[dict], order: int, min_count: int, bos: int,
                    c: int) -> list[tuple[int, ...]]:
    """The start (BOS,), every one-phone history, and the longer histories seen at least
    `min_count` times together with their suffixes. The start comes first."""
    kept = {(bos,)} | {(p,) for p in range(c)}
    for n in range(2, order):
        for h, counts in hist_counts[n].items():
            if counts.sum() >= min_count:
                for k in range(1, n + 1):
                    kept.add(h[-k:])
    return [(bos,)] + sorted(kept - {(bos,)}, key=lambda h: (len(h), h))


def _interpolated(h: tuple, hist_counts: list[dict], discounts: list[float], c: int,
                  probs: dict) -> np.ndarray:
    """P(. | h) over the c phones + BOS + EOS (BOS gets no mass)."""
    if len(h) == 0:
        lower = np.full(c + 2, 1.0 / (c + 1))
        lower[c] = 0.0
    else:
        lower = probs[h[1:]] if h[1:] in probs else _interpolated(
            h[1:], hist_counts, discounts, c, probs)
    counts = hist_counts[len(h)].get(h) if len(h) < len(hist_counts) else None
    if counts is None or counts.sum() == 0:
        return lower
    d = discounts[len(h)]
    total = counts.sum()
    seen = (counts > 0).sum()
    return np.maximum(counts - d, 0.0) / total + (d * seen / total) * lower


def _next_history(h: tuple, q: int, kept: dict | set, order: int) -> tuple:
    """The longest kept suffix of h + (q,), at most order - 1 long ((q,) is always kept)."""
    full = (h + (q,))[-(order - 1):]
    for k in range(len(full), 1, -1):
        if full[-k:] in kept:
            return full[-k:]
    return (q,)


def denominator_graph(lm: PhoneNgram) -> Graph:
    """The n-gram times a 1-state HMM per phone with self-loop, epsilon-free.

    From history state h (current phone q = last(h)): the self-loop emits q with
    log loop[q]; leaving emits the next phone p with log(1 - loop[q]) + log P(p | h) and
    enters next_state[h, p]. The start state has no phone: it leaves with P(p | BOS).
    Final weight of h: log(1 - loop[q]) + log P(</s> | h). The only initial state is 0.
    """
    h, c = lm.logprob.shape
    last = np.array([hist[-1] for hist in lm.histories])
    is_phone = last != lm.bos
    leave = np.zeros(h)
    leave[is_phone] = np.log1p(-np.exp(lm.loop_logprob[last[is_phone]]))
    src = np.repeat(np.arange(h), c)
    dst = lm.next_state.reshape(-1)
    lab = np.tile(np.arange(c), h)
    w = (leave[:, None] + lm.logprob).reshape(-1)
    ok = np.isfinite(w)
    loop_states = np.nonzero(is_phone)[0]
    src = np.concatenate([src[ok], loop_states])
    dst = np.concatenate([dst[ok], loop_states])
    lab = np.concatenate([lab[ok], last[loop_states]])
    w = np.concatenate([w[ok], lm.loop_logprob[last[loop_states]]])
    init = np.full(h, NEG_INF)
    init[0] = 0.0
    fin = np.where(is_phone, leave + lm.log_final, NEG_INF)
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))[None]  # noqa: E731
    return Graph(h, t(src.astype(np.int64)), t(dst.astype(np.int64)),
                 t(lab.astype(np.int64)), t(w), t(init), t(fin))


def chunk_graph(graph: Graph, steps: int = CHUNK_WARMUP_STEPS) -> Graph:
    """LF-MMI §2.4: a chunk starts anywhere in an utterance, so its initial weights are
    the graph's state distribution averaged over `steps` frames from the start (acoustics
    ignored), and it may end in any state (final weight 0 everywhere)."""
    g = graph.to("cpu", torch.float64)
    x = torch.zeros(1, 1, int(g.label.max()) + 1, dtype=torch.float64)
    alpha = g.initial.clone()
    acc = torch.zeros_like(alpha)
    for _ in range(steps):
        alpha = _emit(alpha, x[:, 0], g)
        alpha = alpha - torch.logsumexp(alpha, -1, keepdim=True)  # renormalise each frame
        acc += alpha.exp()
    init = torch.log(acc / steps)
    return Graph(g.num_states, g.src, g.dst, g.label, g.weight, init,
                 torch.zeros_like(g.final))


# ----------------------------------------------------------------- numerators
def phone_sequences(labels: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor,
                                                                         torch.Tensor]:
    """Collapse packed frame labels [B, T] (valid up to `lengths`) into padded phone
    sequences [B, L] and their lengths [B], vectorised over the batch."""
    b, t = labels.shape
    pos = torch.arange(t, device=labels.device)[None, :]
    valid = pos < lengths[:, None]
    start = torch.ones_like(valid)
    start[:, 1:] = labels[:, 1:] != labels[:, :-1]
    start &= valid
    n = start.sum(1)
    l_max = max(int(n.max()), 1) if b else 1
    slot = torch.cumsum(start.long(), 1) - 1  # phone index of each frame
    seqs = torch.zeros(b, l_max, dtype=torch.long, device=labels.device)
    rows = torch.arange(b, device=labels.device)[:, None].expand(b, t)
    seqs[rows[start], slot[start]] = labels[start]
    return seqs, n


def numerator_graphs(phones: torch.Tensor, num_phones: torch.Tensor,
                     loop_logprob: torch.Tensor | None = None) -> Graph:
    """Per sequence, its phones in order with flexible timing: states 0..L (0 = before the
    first phone, i = inside phone i), arcs i -> i+1 emitting phone i+1 and a self-loop on
    each i >= 1; final state L. Padded to the longest sequence (padding arcs -inf).
    Weights are the denominator's HMM transitions when `loop_logprob` is given, so that a
    numerator path scores as the same path does in the denominator, LM aside."""
    b, l_max = phones.shape
    dev = phones.device
    dtype = loop_logprob.dtype if loop_logprob is not None else torch.float64
    i = torch.arange(l_max, device=dev)[None, :].expand(b, l_max)
    real = i < num_phones[:, None]
    if loop_logprob is None:
        loop_w = torch.zeros(b, l_max, dtype=dtype, device=dev)
        leave_w = torch.zeros(b, l_max, dtype=dtype, device=dev)
    else:
        loop_w = loop_logprob.to(dev)[phones]
        prev_loop = torch.cat([torch.full_like(loop_w[:, :1], NEG_INF), loop_w[:, :-1]], 1)
        leave_w = torch.where(i > 0, torch.log1p(-prev_loop.exp()), torch.zeros_like(loop_w))
    src = torch.cat([i, i + 1], 1)
    dst = torch.cat([i + 1, i + 1], 1)
    label = torch.cat([phones, phones], 1)
    weight = torch.cat([leave_w, loop_w], 1).masked_fill(~torch.cat([real, real], 1), NEG_INF)
    s = l_max + 1
    initial = torch.full((b, s), NEG_INF, dtype=dtype, device=dev)
    initial[:, 0] = 0.0
    final = torch.full((b, s), NEG_INF, dtype=dtype, device=dev)
    final[torch.arange(b, device=dev), num_phones] = 0.0
    return Graph(s, src, dst, label, weight, initial, final)


def alignment_logprob(x: torch.Tensor, labels: torch.Tensor,
                      lengths: torch.Tensor) -> torch.Tensor:
    """The fixed-alignment numerator: sum over valid frames of x[t, label_t], per sequence
    (its occupation posterior is the alignment itself)."""
    t = x.shape[1]
    valid = torch.arange(t, device=x.device)[None, :] < lengths[:, None]
    picked = x.gather(2, labels.clamp_min(0)[:, :, None]).squeeze(2)
    return torch.where(valid, picked, torch.zeros_like(picked)).sum(1)


# ----------------------------------------------------------------- forward-backward
def _scatter_logsumexp(values: torch.Tensor, index: torch.Tensor, size: int) -> torch.Tensor:
    """out[b, s] = log sum over {a: index[a] = s} of exp(values[b, a]); -inf when empty."""
    bsz = values.shape[0]
    idx = index.expand(bsz, -1)
    m = torch.full((bsz, size), NEG_INF, dtype=values.dtype, device=values.device)
    m = m.scatter_reduce(1, idx, values, "amax", include_self=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    s = torch.zeros_like(m).scatter_add(1, idx, torch.exp(values - m.gather(1, idx)))
    return torch.log(s) + m


def _arc_scores(x_t: torch.Tensor, g: Graph) -> torch.Tensor:
    """weight + x[t, label] per arc: [B, A]."""
    return g.weight + x_t.gather(1, g.label.expand(x_t.shape[0], -1))


def _emit(alpha: torch.Tensor, x_t: torch.Tensor, g: Graph) -> torch.Tensor:
    """One frame: alpha [B, S] -> [B, S] through every arc."""
    scores = alpha.gather(1, g.src.expand(alpha.shape[0], -1)) + _arc_scores(x_t, g)
    return _scatter_logsumexp(scores, g.dst, g.num_states)


def _leak(alpha: torch.Tensor, log_leaky: float, g: Graph) -> torch.Tensor:
    """Leaky HMM (LF-MMI §2.5): from any state, with weight `leaky`, jump to a state drawn
    from the initial distribution, before each frame. Lets a chunk's paths recover from
    a wrong start without an epsilon arc per state."""
    jump = log_leaky + torch.logsumexp(alpha, -1, keepdim=True) + g.initial
    return torch.logaddexp(alpha, jump)


def _leak_backward(beta: torch.Tensor, log_leaky: float, g: Graph) -> torch.Tensor:
    """The transpose of `_leak` for the beta recursion."""
    jump = log_leaky + torch.logsumexp(beta + g.initial, -1, keepdim=True)
    return torch.logaddexp(beta, jump)


class _LogPartition(torch.autograd.Function):
    """log Z per sequence; d log Z / d x[b, t, c] = occupation posterior of class c."""

    @staticmethod
    def forward(ctx, x, lengths, graph, log_leaky):  # noqa: D401 - autograd API
        b, t, _ = x.shape
        active = torch.arange(t, device=x.device)[None, :] < lengths[:, None]  # [B, T]
        alpha = graph.initial.expand(b, -1).clone()
        pre = x.new_empty(t, b, graph.num_states)  # alpha before each frame's arcs
        for i in range(t):
            on = active[:, i:i + 1]
            if log_leaky is not None:
                alpha = torch.where(on, _leak(alpha, log_leaky, graph), alpha)
            pre[i] = alpha
            alpha = torch.where(on, _emit(alpha, x[:, i], graph), alpha)
        logz = torch.logsumexp(alpha + graph.final, -1)
        ctx.save_for_backward(x, pre, logz, active)
        ctx.graph, ctx.log_leaky = graph, log_leaky
        return logz

    @staticmethod
    def backward(ctx, grad):
        x, pre, logz, active = ctx.saved_tensors
        g, log_leaky = ctx.graph, ctx.log_leaky
        b, t, c = x.shape
        beta = g.final.expand(b, -1).clone()
        occ = torch.zeros_like(x)
        fin = torch.isfinite(logz)[:, None]
        for i in range(t - 1, -1, -1):
            on = active[:, i:i + 1]
            out = _arc_scores(x[:, i], g) + beta.gather(1, g.dst.expand(b, -1))  # [B, A]
            post = torch.exp(pre[i].gather(1, g.src.expand(b, -1)) + out - logz[:, None])
            post = torch.where(on & fin, post, torch.zeros_like(post))
            occ[:, i] = torch.zeros(b, c, dtype=x.dtype, device=x.device).scatter_add(
                1, g.label.expand(b, -1), post)
            new = _scatter_logsumexp(out, g.src, g.num_states)
            if log_leaky is not None:
                new = _leak_backward(new, log_leaky, g)
            beta = torch.where(on, new, beta)
        return grad[:, None, None] * occ, None, None, None


# Below this share of non-zero transitions a CPU runs the product as a sparse (CSR) one:
# 4.5x faster than dense at 527 trigram states (nnz 5 %). GPUs keep the dense product.
SPARSE_MAX_DENSITY = 0.2


def _products(g: Graph, device: torch.device) -> tuple:
    """(forward, backward) transition products p -> p @ T and p -> p @ T^T for the
    dense form of g: sparse CSR ones on a CPU when T is sparse enough, cached on g."""
    trans = g.dense[0]
    if g.products is not None:
        return g.products
    density = float((trans != 0).float().mean())
    if device.type == "cpu" and density < SPARSE_MAX_DENSITY:
        with warnings.catch_warnings():  # "sparse CSR support is in beta"
            warnings.simplefilter("ignore", UserWarning)
            t_csr, tt_csr = trans.to_sparse_csr(), trans.T.contiguous().to_sparse_csr()
        prods = (lambda p: (tt_csr @ p.T).T, lambda p: (t_csr @ p.T).T)
    else:
        prods = (lambda p: p @ trans, lambda p: p @ trans.T)
    g.products = prods
    return prods


def _log_product(a: torch.Tensor, product, leaky: float = 0.0,
                 iota: torch.Tensor | None = None, transpose: bool = False) -> torch.Tensor:
    """log(product(exp(a))) for log-space a [B, S], with the leaky HMM folded in.

    The largest entry of each row is factored out first, so exp never overflows, and a
    state whose every contribution is below e^-87 of the row's best (fp32) counts as
    unreachable (Kaldi's chain code rescales each frame the same way). In that shifted
    probability domain the leak (see `_leak`) is one multiply-add: before the forward
    product p += leaky * sum(p) * iota, after the backward (transposed) one
    q += leaky * (q . iota), with iota = exp(initial)."""
    m = a.max(-1, keepdim=True).values
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(a - m)
    if leaky and not transpose:
        p = p + leaky * p.sum(-1, keepdim=True) * iota
    q = product(p)
    if leaky and transpose:
        q = q + leaky * (q * iota).sum(-1, keepdim=True)
    return torch.log(q) + m


class _DenseLogPartition(torch.autograd.Function):
    """`_LogPartition` for a state-labelled graph: matrix products instead of arc
    gathers and scatters. Occupation of class c at frame t = sum over the states d
    labelled c of alpha_{t+1}(d) beta_{t+1}(d) / Z. Classes map to states and back by
    products with a one-hot [S, C] matrix rather than index_add, which is deterministic
    on a GPU too (a resumed run repeats its steps bit for bit)."""

    @staticmethod
    def forward(ctx, x, lengths, graph, log_leaky):  # noqa: D401 - autograd API
        onehot = _state_onehot(graph, x.shape[2], x.dtype)
        forward_product = _products(graph, x.device)[0]
        b, t, _ = x.shape
        xs = x @ onehot.T  # [B, T, S]: each state's class score
        active = torch.arange(t, device=x.device)[None, :] < lengths[:, None]
        leaky, iota = math.exp(log_leaky) if log_leaky is not None else 0.0, graph.initial.exp()
        alpha = graph.initial.expand(b, -1).clone()
        post = x.new_empty(b, t, graph.num_states)  # alpha after each frame's arcs
        for i in range(t):
            new = _log_product(alpha, forward_product, leaky, iota) + xs[:, i]
            alpha = torch.where(active[:, i:i + 1], new, alpha)
            post[:, i] = alpha
        logz = torch.logsumexp(alpha + graph.final, -1)
        ctx.save_for_backward(xs, post, logz, active, onehot)
        ctx.graph, ctx.log_leaky = graph, log_leaky
        return logz

    @staticmethod
    def backward(ctx, grad):
        xs, post, logz, active, onehot = ctx.saved_tensors
        g, log_leaky = ctx.graph, ctx.log_leaky
        backward_product = _products(g, xs.device)[1]
        b, t, _ = xs.shape
        beta = g.final.expand(b, -1).clone()
        gamma = torch.zeros_like(post)  # state occupation per frame
        fin = torch.isfinite(logz)[:, None]
        leaky, iota = math.exp(log_leaky) if log_leaky is not None else 0.0, g.initial.exp()
        for i in range(t - 1, -1, -1):
            on = active[:, i:i + 1]
            occ = torch.exp(post[:, i] + beta - logz[:, None])
            gamma[:, i] = torch.where(on & fin, occ, torch.zeros_like(occ))
            new = _log_product(xs[:, i] + beta, backward_product, leaky, iota, transpose=True)
            beta = torch.where(on, new, beta)
        return grad[:, None, None] * (gamma @ onehot), None, None, None


def _state_onehot(g: Graph, num_classes: int, dtype: torch.dtype) -> torch.Tensor:
    """[S, C]: 1 where the state's label is the class (the start state has label 0 but
    no incoming arc, so its column entry is never reached)."""
    lab = g.dense[1]
    if int(lab.max()) >= num_classes:
        raise ValueError(f"graph label {int(lab.max())} >= the {num_classes} network outputs")
    return torch.nn.functional.one_hot(lab, num_classes).to(dtype)


def log_partition(x: torch.Tensor, lengths: torch.Tensor, graph: Graph,
                  leaky: float = 0.0, method: str = "auto") -> torch.Tensor:
    """log of the total weight of all length-`lengths[b]` paths through `graph` (or
    graph b when it holds one per sequence), scoring x [B, T, C]: [B]. Differentiable
    in x; frames past a sequence's length are ignored.

    `method`: arcs (gather/scatter over arcs, any graph), dense (a transition matrix,
    state-labelled graphs only, see `Graph.dense_form`) or auto (dense when possible)."""
    if graph.src.shape[0] not in (1, x.shape[0]):
        raise ValueError(f"graph batch {graph.src.shape[0]} fits neither 1 nor {x.shape[0]}")
    if method not in ("auto", "arcs", "dense"):
        raise ValueError(f"unknown forward-backward method {method!r}")
    dense = graph.dense_form() if method != "arcs" else None
    if method == "dense" and dense is None:
        raise ValueError("graph is not state-labelled (or too large): use method='arcs'")
    g = graph.to(x.device, x.dtype)
    log_leaky = math.log(leaky) if leaky > 0 else None
    fn = _DenseLogPartition if dense is not None else _LogPartition
    return fn.apply(x, lengths.to(x.device), g, log_leaky)


# ----------------------------------------------------------------- the objective
@dataclass
class SequenceOut(LossOut):
    """LossOut plus the parts of the sequence loss (all per scored frame)."""

    # MMI: (log p_num - log p_den) / frames (<= 0 is typical); sMBR: expected frame
    # accuracy over the denominator's paths, in [0, 1]
    objective: float = 0.0
    ce: float = 0.0
    l2: float = 0.0
    kd: float = 0.0  # cross-entropy against the reference (CE) model's posteriors


def scored_segments(logits: torch.Tensor, labels: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The scored frames (label != IGNORE) of each row moved to the front: logits
    [B, T', C], labels [B, T'] and lengths [B]. A row's scored frames must be one
    contiguous run (a chunk or a whole utterance), as the loader makes them."""
    scored = labels != IGNORE
    lengths = scored.sum(1)
    t = labels.shape[1]
    pos = torch.arange(t, device=labels.device)[None, :].expand_as(labels)
    first = torch.where(scored, pos, torch.full_like(pos, t)).min(1).values
    last = torch.where(scored, pos, torch.full_like(pos, -1)).max(1).values
    gaps = (lengths > 0) & (last - first + 1 != lengths)
    if bool(gaps.any()):
        raise ValueError(f"row {int(gaps.nonzero()[0, 0])}: scored frames are not one "
                         "contiguous run; a sequence criterion needs whole segments")
    t_out = max(int(lengths.max()), 1) if len(lengths) else 1
    idx = (first.clamp_max(t - 1)[:, None] + torch.arange(t_out, device=labels.device)[None])
    idx = idx.clamp_max(t - 1)
    packed = logits.gather(1, idx[:, :, None].expand(-1, -1, logits.shape[2]))
    return packed, labels.gather(1, idx), lengths


_HINTS = {
    "network outputs": "the model diverged or its input holds NaN: lower the learning rate "
                       "or check the features",
    "denominator log-likelihood": "no path of the denominator graph fits the utterance: "
                                  "check that the graph was estimated for this class set",
    "numerator log-likelihood": "the utterance has more phones than frames, or labels "
                                "outside the class set",
}


def _check_finite(values: torch.Tensor, what: str, utt_ids: Sequence[str] | None,
                  where: str) -> None:
    """values [B, ...]: raise NonFiniteSequenceError naming the first bad row."""
    bad = ~torch.isfinite(values.reshape(values.shape[0], -1))
    if bool(bad.any()):
        i = int(bad.any(1).nonzero()[0, 0])
        name = utt_ids[i] if utt_ids is not None and i < len(utt_ids) else f"row {i}"
        raise NonFiniteSequenceError(
            f"{where}: non-finite {what} for utterance {name} ({int(bad.sum())} of "
            f"{bad.numel()} values); {_HINTS[what]}")


def _prepare(logits: torch.Tensor, labels: torch.Tensor, log_priors: torch.Tensor | None,
             prior_scale: float, am_scale: float, utt_ids: Sequence[str] | None, where: str):
    """Scored frames packed to the front, and x = am_scale * (logits - prior_scale *
    log_priors) checked finite on them."""
    packed, lab, lengths = scored_segments(logits, labels)
    x = packed
    if log_priors is not None and prior_scale:
        x = x - prior_scale * log_priors.to(x)
    if am_scale != 1.0:
        x = x * am_scale
    valid = torch.arange(x.shape[1], device=x.device)[None, :] < lengths[:, None]
    _check_finite(torch.where(valid[:, :, None], x.detach(), torch.zeros_like(x[:1, :1])),
                  "network outputs", utt_ids, where)
    return packed, x, lab, lengths, valid


def _numerator(x: torch.Tensor, lab: torch.Tensor, lengths: torch.Tensor, numerator: str,
               loop_logprob: torch.Tensor | None) -> torch.Tensor:
    if numerator == "alignment":
        return alignment_logprob(x, lab, lengths)
    if numerator == "flexible":
        seqs, n = phone_sequences(lab, lengths)
        return log_partition(x, lengths, numerator_graphs(seqs, n, loop_logprob), 0.0)
    raise ValueError(f"unknown numerator {numerator!r}: alignment or flexible")


def reference_ce(logits: torch.Tensor, ref_logits: torch.Tensor, labels: torch.Tensor
                 ) -> torch.Tensor:
    """Cross-entropy of the model's posteriors against a reference model's (the CE model
    the sequence training started from), per scored frame (label != IGNORE): knowledge
    distillation as a smoothing term (KL-regularised training, Yu et al. 2013: its
    gradient is that of KL(p_ref || p)). The reference gets no gradient."""
    keep = labels != IGNORE
    target = torch.softmax(ref_logits.detach()[keep].to(logits.dtype), -1)
    return -(target * torch.log_softmax(logits[keep], -1)).sum(-1).mean()


def _regularised(objective: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor,
                 packed: torch.Tensor, valid: torch.Tensor, frames: int, ce_weight: float,
                 l2: float, kd_weight: float = 0.0,
                 ref_logits: torch.Tensor | None = None) -> SequenceOut:
    """Loss = -objective + ce_weight * CE + l2 / 2 * |logits|^2 per scored frame (LF-MMI
    §2.6's two regularisers, on our single output layer) + kd_weight * the cross-entropy
    against `ref_logits` (`reference_ce`; F-smoothing's frame criterion with the CE model's
    posteriors as targets: pulls toward the model the training started from)."""
    loss = -objective
    ce = ce_loss(logits, labels)
    if ce_weight:
        loss = loss + ce_weight * ce.loss
    l2_term = 0.5 * (packed[valid] ** 2).sum() / frames
    if l2:
        loss = loss + l2 * l2_term
    kd = 0.0
    if kd_weight and ref_logits is not None:
        kd_term = reference_ce(logits, ref_logits, labels)
        loss = loss + kd_weight * kd_term
        kd = float(kd_term.detach())
    return SequenceOut(loss, frames, ce.correct, objective=float(objective.detach()),
                       ce=float(ce.loss.detach()), l2=float(l2_term.detach()), kd=kd)


def mmi_loss(logits: torch.Tensor, labels: torch.Tensor, den: Graph, *,
             numerator: str = "alignment", loop_logprob: torch.Tensor | None = None,
             leaky: float = 0.1, ce_weight: float = 0.1, l2: float = 0.0,
             log_priors: torch.Tensor | None = None, prior_scale: float = 0.0,
             am_scale: float = 1.0, utt_ids: Sequence[str] | None = None,
             where: str = "minibatch", kd_weight: float = 0.0,
             ref_logits: torch.Tensor | None = None,
             weights: torch.Tensor | None = None) -> SequenceOut:
    """LF-MMI on a minibatch: logits [B, T, C], labels [B, T] (IGNORE = not scored).

    x = am_scale * (logits - prior_scale * log_priors). The network's logits serve as the
    log-likelihoods directly (as in LF-MMI): a per-frame constant, such as log-softmax's
    normaliser, cancels between numerator and denominator, which each take one class per
    frame. Objective per scored frame: log p_num - log p_den; see `_regularised`.
    """
    packed, x, lab, lengths, valid = _prepare(logits, labels, log_priors, prior_scale,
                                              am_scale, utt_ids, where)
    frames = int(lengths.sum())
    if frames == 0:
        return SequenceOut(logits.sum() * 0.0, 0, 0)
    den_logz = log_partition(x, lengths, den, leaky)
    num_logz = _numerator(x, lab, lengths, numerator, loop_logprob)
    has = lengths > 0
    _check_finite(den_logz.detach()[has], "denominator log-likelihood",
                  _subset(utt_ids, has), where)
    _check_finite(num_logz.detach()[has], "numerator log-likelihood",
                  _subset(utt_ids, has), where)
    obj = _weighted(num_logz - den_logz, weights)[has].sum() / frames
    return _regularised(obj, logits, labels, packed, valid, frames, ce_weight, l2,
                        kd_weight, ref_logits)


def expected_accuracy(x: torch.Tensor, lengths: torch.Tensor, graph: Graph,
                      reward: torch.Tensor, leaky: float = 0.0
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """(log Z, E[accuracy]) per sequence: the accuracy of a path is the sum over its frames
    of reward[b, t, label of the arc taken at t], averaged over all paths weighted by
    their posterior (the expectation semiring on a state-labelled graph; lattice-free
    sMBR, Kanda et al. 2018). Differentiable by autograd through the recursion (its
    tensors are [B, S] per frame).

    Per state the recursion carries the mass of the paths ending there (log, max-shifted
    as in `_log_product`) and their mean reward so far; the leak runs in the probability
    domain of the shifted frame, which keeps every gradient finite."""
    dense = graph.dense_form()
    if dense is None:
        raise ValueError("expected_accuracy needs a state-labelled graph (Graph.dense_form)")
    g = graph.to(x.device, x.dtype)
    product, onehot = _products(g, x.device)[0], _state_onehot(g, x.shape[2], x.dtype)
    xs, rs = x @ onehot.T, reward.to(x.dtype) @ onehot.T  # per state (see _state_onehot)
    b, t, _ = x.shape
    active = torch.arange(t, device=x.device)[None, :] < lengths.to(x.device)[:, None]
    iota = g.initial.exp()
    la = g.initial.expand(b, -1)
    ea = torch.zeros_like(la)
    for i in range(t):
        m = la.max(-1, keepdim=True).values
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        p = torch.exp(la - m)
        q = p * ea
        if leaky > 0:
            p = p + leaky * p.sum(-1, keepdim=True) * iota
            q = q + leaky * q.sum(-1, keepdim=True) * iota
        mass, carried = product(torch.cat([p, q])).split(b)  # one product for both
        reach = mass > 0
        safe = torch.where(reach, mass, torch.ones_like(mass))
        new_la = torch.where(reach, torch.log(safe) + m, torch.full_like(m, NEG_INF))
        new_ea = torch.where(reach, carried / safe, torch.zeros_like(mass))
        on = active[:, i:i + 1]
        la = torch.where(on, new_la + xs[:, i], la)
        ea = torch.where(on, new_ea + rs[:, i], ea)
    w = la + g.final
    logz = torch.logsumexp(w, -1)
    post = torch.softmax(torch.where(torch.isfinite(logz)[:, None], w, torch.zeros_like(w)), -1)
    return logz, (post * ea).sum(-1)


def smbr_loss(logits: torch.Tensor, labels: torch.Tensor, den: Graph, *,
              numerator: str = "alignment", loop_logprob: torch.Tensor | None = None,
              leaky: float = 0.1, ce_weight: float = 0.1, l2: float = 0.0,
              log_priors: torch.Tensor | None = None, prior_scale: float = 0.0,
              am_scale: float = 1.0, utt_ids: Sequence[str] | None = None,
              where: str = "minibatch", same_phone: torch.Tensor | None = None,
              kd_weight: float = 0.0, ref_logits: torch.Tensor | None = None,
              weights: torch.Tensor | None = None) -> SequenceOut:
    """Lattice-free sMBR (Kanda et al. 2018): maximise the expected frame accuracy over all
    paths of the denominator graph. A frame's reward for class c is 1 when c is the
    aligned class (numerator alignment) or the numerator's occupation posterior of c
    (numerator flexible, Kanda's soft reference; a target like CE's labels, so no
    gradient flows through it). Objective per scored frame: E[accuracy]
    / frames, in [0, 1]; same inputs and regularisers as `mmi_loss`.
    `same_phone` [C, C] (context-dependent classes): 1 where two classes are the same
    phone; the reward is then the phone accuracy (a class of the reference's phone in
    another context is right, as Kaldi's sMBR counts a state correct by its phone)."""
    packed, x, lab, lengths, valid = _prepare(logits, labels, log_priors, prior_scale,
                                              am_scale, utt_ids, where)
    frames = int(lengths.sum())
    if frames == 0:
        return SequenceOut(logits.sum() * 0.0, 0, 0)
    has = lengths > 0
    reward = _reward(x.detach(), lab, lengths, numerator, loop_logprob)
    if same_phone is not None:
        reward = reward @ same_phone.to(reward.device, reward.dtype)
    _check_finite(reward[has], "numerator log-likelihood", _subset(utt_ids, has), where)
    logz, acc = expected_accuracy(x, lengths, den, reward, leaky)
    _check_finite(logz.detach()[has], "denominator log-likelihood",
                  _subset(utt_ids, has), where)
    obj = _weighted(acc, weights)[has].sum() / frames
    return _regularised(obj, logits, labels, packed, valid, frames, ce_weight, l2,
                        kd_weight, ref_logits)


def _weighted(per_seq: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """Each sequence's objective times its weight (a pseudo-labeled utterance's confidence:
    semi-supervised sequence training, Vesely et al. 2013); None: all 1."""
    return per_seq if weights is None else per_seq * weights.to(per_seq)


def _reward(x: torch.Tensor, lab: torch.Tensor, lengths: torch.Tensor, numerator: str,
            loop_logprob: torch.Tensor | None) -> torch.Tensor:
    """[B, T, C] per-frame accuracy of each class (0 past a sequence's length)."""
    valid = torch.arange(x.shape[1], device=x.device)[None, :] < lengths[:, None]
    if numerator == "alignment":
        onehot = torch.nn.functional.one_hot(lab.clamp_min(0), x.shape[2]).to(x.dtype)
        return onehot * valid[:, :, None]
    leaf = x.detach().requires_grad_()
    with torch.enable_grad():
        logz = _numerator(leaf, lab, lengths, numerator, loop_logprob)
        occ, = torch.autograd.grad(logz.sum(), leaf)  # the numerator's posteriors
    return torch.where(torch.isfinite(logz)[:, None, None], occ, torch.full_like(occ, math.nan))


def _subset(utt_ids: Sequence[str] | None, keep: torch.Tensor) -> list[str] | None:
    if utt_ids is None:
        return None
    return [u for u, k in zip(utt_ids, keep.tolist()) if k]


# ----------------------------------------------------------------- configured
class SequenceCriterion:
    """The sequence criterion a recipe calls per minibatch, configured from its `train.*`
    section (`SequenceConfig`: `train.criterion` mmi or smbr, the numerator, leaky HMM,
    regularisers, the denominator n-gram).

    Built once from the labeled split's frame labels (the same on every worker: estimate
    it from the whole split, or on rank 0 and broadcast `lm.to_dict()`).
    """

    def __init__(self, lm: PhoneNgram, sc: SequenceConfig,
                 log_priors: torch.Tensor | None = None,
                 class_phone: np.ndarray | None = None):
        self.lm = lm
        # context-dependent classes: sMBR's accuracy is the phone's (smbr_loss same_phone)
        self.same_phone = (None if class_phone is None else torch.from_numpy(
            (np.asarray(class_phone)[:, None] == np.asarray(class_phone)[None, :])
            .astype(np.float32)))
        self.sc = sc
        self.full = denominator_graph(lm)
        self.chunk = chunk_graph(self.full)
        for g in (self.full, self.chunk):
            g.dense_form()  # once, before the graphs are copied to a device
        self.loop_logprob = torch.from_numpy(lm.loop_logprob)
        self.log_priors = log_priors
        self._on: dict[tuple, tuple[Graph, Graph]] = {}

    @classmethod
    def from_labels(cls, label_seqs: Sequence[np.ndarray], num_classes: int,
                    sc: SequenceConfig, class_phone: np.ndarray | None = None
                    ) -> "SequenceCriterion":
        """The denominator is an n-gram over the classes as they follow each other in the
        labels: with context-dependent classes (`class_phone`: each class's phone) that is
        over the tree's leaves, whose sequences in the data are context-consistent."""
        seqs = list(label_seqs)
        lm = estimate_phone_ngram(seqs, num_classes, sc.den_ngram_order, sc.den_min_count)
        return cls(lm, sc, class_log_priors(seqs, num_classes), class_phone)

    def graph_size(self) -> dict[str, int]:
        return {"states": self.full.num_states, "arcs": self.full.num_arcs,
                "order": self.lm.order}

    def _graphs(self, device: torch.device, dtype: torch.dtype) -> tuple[Graph, Graph]:
        key = (str(device), dtype)
        if key not in self._on:
            self._on[key] = (self.full.to(device, dtype), self.chunk.to(device, dtype))
        return self._on[key]

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor, chunked: bool = True,
                 utt_ids: Sequence[str] | None = None, where: str = "minibatch",
                 ref_logits: torch.Tensor | None = None,
                 weights: torch.Tensor | None = None) -> SequenceOut:
        """`chunked`: the rows are chunks of utterances (LF-MMI's chunk graph) rather than
        whole utterances (the full graph, with its start and final weights). `ref_logits`:
        the CE model's outputs on the same rows (train.sequence_kd_weight's targets).
        `weights` [B]: each row's weight on the sequence objective (pseudo-labels'
        confidences; None: 1)."""
        sc = self.sc
        full, chunk = self._graphs(logits.device, logits.dtype)
        extra = {"same_phone": self.same_phone} if sc.criterion == "smbr" else {}
        loss = smbr_loss if sc.criterion == "smbr" else mmi_loss
        return loss(logits, labels, chunk if chunked else full, **extra,
                    numerator=sc.sequence_numerator,
                    loop_logprob=self.loop_logprob.to(logits.device, logits.dtype),
                    leaky=sc.leaky_hmm, ce_weight=sc.sequence_ce_weight, l2=sc.sequence_l2,
                    log_priors=self.log_priors, prior_scale=sc.sequence_prior_scale,
                    am_scale=sc.sequence_am_scale, utt_ids=utt_ids, where=where,
                    kd_weight=getattr(sc, "sequence_kd_weight", 0.0), ref_logits=ref_logits,
                    weights=weights)


def pseudo_references(topk_idx: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Frame references [B, T] of soft-target rows (an unlabeled minibatch): the teacher's
    most likely class per scored frame (its top-1 target), IGNORE elsewhere."""
    return torch.where(mask, topk_idx[..., 0], torch.full_like(topk_idx[..., 0], IGNORE))


def pseudolabel_confidences(storage: Any, step_dir: str) -> dict[str, float]:
    """{utt_id: confidence} of the pseudo-labels a finished pseudolabel step kept
    (labels/*.parquet, kept = true): train.pseudolabels with the sequence recipe."""
    uris = (storage.list(join(step_dir, "labels"), suffix=".parquet")
            if storage.exists(join(step_dir, SUCCESS)) else [])
    if not uris:
        raise StepError(f"train.pseudolabels: {step_dir} holds no finished pseudolabel step's "
                         "labels/*.parquet (run `amflow pseudolabel` for that run first, or "
                         "clear train.pseudolabels)")
    out: dict[str, float] = {}
    for uri in uris:
        cols = storage.read_parquet(uri, columns=["utt_id", "confidence", "kept"]).to_pydict()
        out.update((u, float(c)) for u, c, k in zip(cols["utt_id"], cols["confidence"],
                                                    cols["kept"]) if k)
    return out


def split_label_sequences(storage: Any, uris: Sequence[str], stack: int = 3
                          ) -> list[np.ndarray]:
    """Each utterance's frame labels (low frame rate, offset 0) in a labeled split's
    partitions, partition by partition, row by row, reading the label columns only (no
    features): the input of `estimate_phone_ngram`. Every worker reading the whole split
    builds the same denominator. Rows without labels are skipped (the loader rejects them)."""
    out = []
    for uri in uris:
        cols = records.columns(records.read_table(storage, uri,
                                                  ["num_frames", "labels", "frame_labels"]))
        for n, lab, flab in zip(cols["num_frames"], cols["labels"], cols["frame_labels"]):
            lab = records.decode_int16(lab)
            if lab is not None and len(lab) == n:
                out.append(lab)
            elif flab is not None and len(flab) >= n > 0:  # as SplitIndex.load
                out.append(records.offset_labels(records.decode_int16(flab), 0, stack, n))
    return out


def class_log_priors(label_seqs: Iterable[np.ndarray], num_classes: int) -> torch.Tensor:
    """log of each class's share of the labeled frames (add-one smoothed)."""
    counts = np.ones(num_classes)
    for lab in label_seqs:
        lab = np.asarray(lab)
        counts += np.bincount(lab[lab != IGNORE].astype(np.int64), minlength=num_classes)
    return torch.from_numpy(np.log(counts / counts.sum()))
