"""Rebuilding the teacher's distribution from its stored top-k logits.

Shared by the targets step (fidelity report) and training (distillation loss), so it
lives in plumbing below both rather than in training/ (tasks/ must not import training/).
"""
from __future__ import annotations

import torch


def teacher_log_probs(topk_idx: torch.Tensor, topk_logit: torch.Tensor, num_classes: int,
                      fill: float, temperature: float = 1.0) -> torch.Tensor:
    """log of the full rebuilt teacher distribution [..., C]: the top-k logits in place,
    every other logit `fill` (for tests, inspection and the targets fidelity report)."""
    full = torch.full((*topk_idx.shape[:-1], num_classes), float(fill),
                      dtype=torch.float32, device=topk_logit.device)
    full.scatter_(-1, topk_idx.long(), topk_logit.float())
    return torch.log_softmax(full / temperature, dim=-1)
