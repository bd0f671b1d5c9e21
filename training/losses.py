"""Frame-level training criteria.

- `ce_loss`: cross-entropy against hard labels (alignments); label `IGNORE` (-100) marks
  frames that are padding or chunk context.
- `distill_loss`: cross-entropy against the teacher's posterior, rebuilt from its top-k
  logits per frame (paper V-C): the missing logits are set to `fill` (a large negative
  number) and the full C-way softmax is taken, at temperature T for both teacher and
  student (the loss is multiplied by T**2 so gradients keep their scale, as in Hinton's
  distillation). The rebuild is exact but never materialises the [N, C] target: with
  z = logsumexp(top-k logits / T, (C - k) copies of fill / T) the teacher probability is
  p_i = exp(l_i / T - z) on the top-k classes and p_f = exp(fill / T - z) on every other
  class, so  CE = -sum_k p_i log q_i - p_f (sum_all log q - sum_k log q_i).

- `phone_targets`: top-k targets over context-dependent classes summed per phone (the
  phone stage of train.grow trains a phone-class model on a leaf run's targets).
- `phone_loss`: with context-dependent classes (senones), the same criterion on each
  frame's *phone*: the classes' probabilities summed per central phone, against the
  label's phone or the teacher's phone posterior (`train.phone_weight`). Since
  -log q(leaf) = -log q(phone) - log q(leaf | phone), CE + w * phone CE weighs the
  phone decision (1 + w) times the choice among its context leaves: w = 0 is plain
  senone training, w -> inf the monophone model, which is what few labeled frames
  per leaf favour (Bell & Renals 2015 add such a context-independent task as a second
  output layer; here it shares the senone layer, so models and decoding are unchanged).

Every loss is the mean over the scored frames of the minibatch and comes back with the
number of scored frames and of correctly classified frames (for frame accuracy: against
the label, or against the teacher's best class).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from core.soft_targets import teacher_log_probs  # noqa: F401  (re-exported: tests, callers)

IGNORE = -100


@dataclass
class LossOut:
    loss: torch.Tensor  # scalar, mean over scored frames (0 with a graph if none)
    frames: int
    correct: int


def ce_loss(logits: torch.Tensor, labels: torch.Tensor) -> LossOut:
    """logits [B, T, C], labels [B, T] (IGNORE = not scored)."""
    c = logits.shape[-1]
    flat = logits.reshape(-1, c)
    lab = labels.reshape(-1)
    mask = lab != IGNORE
    n = int(mask.sum())
    if n == 0:
        return LossOut(flat.sum() * 0.0, 0, 0)
    sel = flat[mask]
    tgt = lab[mask]
    if int(tgt.max()) >= c or int(tgt.min()) < 0:
        raise ValueError(f"label out of range [0, {c}): min {int(tgt.min())} max {int(tgt.max())}")
    loss = F.cross_entropy(sel, tgt, reduction="mean")
    with torch.no_grad():
        correct = int((sel.argmax(-1) == tgt).sum())
    return LossOut(loss, n, correct)


def teacher_log_normaliser(topk_logit: torch.Tensor, num_classes: int, fill: float,
                           temperature: float = 1.0) -> torch.Tensor:
    """log Z of the rebuilt teacher softmax, per frame: [..., k] -> [...]."""
    t = topk_logit / temperature
    k = t.shape[-1]
    if num_classes > k:
        rest = torch.full_like(t[..., :1], fill / temperature + math.log(num_classes - k))
        t = torch.cat([t, rest], dim=-1)
    return torch.logsumexp(t, dim=-1)


def teacher_probs(topk_idx: torch.Tensor, topk_logit: torch.Tensor, num_classes: int,
                  fill: float, temperature: float = 1.0) -> torch.Tensor:
    """The full rebuilt teacher distribution [..., C]."""
    return teacher_log_probs(topk_idx, topk_logit, num_classes, fill, temperature).exp()


def distill_loss(logits: torch.Tensor, topk_idx: torch.Tensor, topk_logit: torch.Tensor,
                 mask: torch.Tensor, fill: float, temperature: float = 1.0) -> LossOut:
    """logits [B, T, C]; topk_idx/topk_logit [B, T, k]; mask [B, T] bool (scored frames)."""
    c = logits.shape[-1]
    n = int(mask.sum())
    if n == 0:
        return LossOut(logits.sum() * 0.0, 0, 0)
    sel = logits[mask]  # [N, C]
    idx = topk_idx[mask]  # [N, k]
    val = topk_logit[mask].to(sel.dtype)
    if int(idx.max()) >= c or int(idx.min()) < 0:
        raise ValueError(f"top-k class index out of range [0, {c}): the targets were made "
                         f"for a different class inventory (max index {int(idx.max())})")
    T = float(temperature)
    logq = torch.log_softmax(sel / T, dim=-1)
    logz = teacher_log_normaliser(val, c, fill, T)  # [N]
    p_top = torch.exp(val / T - logz[:, None])  # [N, k]
    logq_top = logq.gather(-1, idx)  # [N, k]
    per_frame = -(p_top * logq_top).sum(-1)
    if c > idx.shape[-1]:
        p_fill = torch.exp(fill / T - logz)  # [N]
        per_frame = per_frame - p_fill * (logq.sum(-1) - logq_top.sum(-1))
    loss = per_frame.mean() * (T * T)
    with torch.no_grad():
        best = idx.gather(-1, val.argmax(-1, keepdim=True)).squeeze(-1)
        correct = int((sel.argmax(-1) == best).sum())
    return LossOut(loss, n, correct)


def phone_matrix(class_phone: torch.Tensor) -> torch.Tensor:
    """[C, P] 0/1: class c -> its phone class_phone[c] (P = the largest phone id + 1)."""
    return F.one_hot(class_phone.long()).float()


def phone_log_probs(logits: torch.Tensor, to_phone: torch.Tensor,
                    temperature: float = 1.0) -> torch.Tensor:
    """log of the classes' softmax summed per phone: [N, C] -> [N, P]."""
    logq = torch.log_softmax(logits / temperature, dim=-1)
    top = logq.max(-1, keepdim=True).values
    # Shifted by each frame's best class: the sum cannot underflow where it matters.
    return torch.log((logq - top).exp() @ to_phone.to(logq.dtype)).clamp_min(-1e4) + top


def phone_loss(logits: torch.Tensor, to_phone: torch.Tensor,
               labels: torch.Tensor | None = None, topk_idx: torch.Tensor | None = None,
               topk_logit: torch.Tensor | None = None, mask: torch.Tensor | None = None,
               fill: float = -1.0e4, temperature: float = 1.0) -> torch.Tensor:
    """Mean phone-level CE over the scored frames (`to_phone`: `phone_matrix`): against
    `labels`' phones, or against the teacher's posterior (top-k, rebuilt as in
    `distill_loss`) summed per phone."""
    c = logits.shape[-1]
    if to_phone.shape[0] != c:
        raise ValueError(f"the phone map has {to_phone.shape[0]} classes; the model has {c}")
    if labels is not None:
        lab = labels.reshape(-1)
        keep = lab != IGNORE
        if not bool(keep.any()):
            return logits.sum() * 0.0
        logp = phone_log_probs(logits.reshape(-1, c)[keep], to_phone)
        return F.nll_loss(logp, to_phone[lab[keep]].argmax(-1))
    if not bool(mask.any()):
        return logits.sum() * 0.0
    T = float(temperature)
    logp = phone_log_probs(logits[mask], to_phone, T)
    with torch.no_grad():
        teacher = teacher_log_probs(topk_idx[mask], topk_logit[mask], c, fill, T).exp()
        teacher_phone = teacher @ to_phone.to(teacher.dtype)
    return -(teacher_phone * logp).sum(-1).mean() * (T * T)


def phone_targets(topk_idx: torch.Tensor, topk_logit: torch.Tensor, class_phone: torch.Tensor,
                  fill: float, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k targets over context-dependent classes -> targets over their phones (train.grow's
    phone stage): every phone, with logit T x log of the teacher's posterior at temperature
    T summed over the phone's classes, so that `distill_loss` at T reads that phone
    posterior exactly. [..., k] -> [..., P] (P = the largest phone id + 1)."""
    T = float(temperature)
    to_phone = phone_matrix(class_phone).to(topk_logit.device)
    p = teacher_log_probs(topk_idx, topk_logit, to_phone.shape[0], fill, T).exp() @ to_phone
    idx = torch.arange(to_phone.shape[1], device=topk_idx.device).expand(p.shape).contiguous()
    return idx, T * torch.log(p.clamp_min(1e-30))

