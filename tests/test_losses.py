"""Criteria: CE with ignored frames, exact top-k distillation, temperature."""
import math

import pytest
import torch
import torch.nn.functional as F

from training.losses import IGNORE, ce_loss, distill_loss, teacher_probs

torch.set_num_threads(1)


def test_ce_ignores_padding_and_counts_correct():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 4)
    labels = torch.tensor([[0, 1, 2, IGNORE, IGNORE], [3, 3, IGNORE, 1, 0]])
    out = ce_loss(logits, labels)
    m = labels != IGNORE
    assert out.frames == int(m.sum())
    assert torch.allclose(out.loss, F.cross_entropy(logits[m], labels[m]))
    assert out.correct == int((logits[m].argmax(-1) == labels[m]).sum())
    empty = ce_loss(logits, torch.full((2, 5), IGNORE))
    assert empty.frames == 0 and float(empty.loss) == 0.0
    with pytest.raises(ValueError):
        ce_loss(logits, torch.full((2, 5), 4))


@pytest.mark.parametrize("fill,temperature", [(-1e4, 1.0), (-3.0, 1.0), (-2.0, 2.5)])
def test_distill_equals_full_reconstruction(fill, temperature):
    torch.manual_seed(0)
    b, t, c, k = 2, 6, 11, 3
    logits = torch.randn(b, t, c, requires_grad=True)
    teacher = torch.randn(b, t, c) * 3
    val, idx = teacher.topk(k, dim=-1)
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[1, 4:] = False
    out = distill_loss(logits, idx, val, mask, fill=fill, temperature=temperature)
    p = teacher_probs(idx[mask], val[mask], c, fill, temperature)  # explicit [N, C] target
    assert torch.allclose(p.sum(-1), torch.ones(len(p)))
    ref = -(p * torch.log_softmax(logits[mask] / temperature, -1)).sum(-1).mean() * temperature**2
    assert torch.allclose(out.loss, ref, atol=1e-5)
    g1, = torch.autograd.grad(out.loss, logits)
    g2, = torch.autograd.grad(ref, logits)
    assert torch.allclose(g1, g2, atol=1e-6)
    assert out.frames == int(mask.sum())
    assert out.correct == int((logits[mask].argmax(-1) == teacher[mask].argmax(-1)).sum())


def test_large_negative_fill_keeps_mass_on_topk():
    idx = torch.tensor([[2, 0]])
    val = torch.tensor([[1.0, 0.0]])
    p = teacher_probs(idx, val, 5, fill=-1e4)
    assert torch.allclose(p[0, [2, 0]], torch.softmax(val[0], -1))
    assert float(p[0, [1, 3, 4]].sum()) == 0.0


def test_distillation_fits_a_linear_student():
    torch.manual_seed(0)
    c, d = 6, 10
    w_true = torch.randn(d, c) * 2
    x = torch.randn(400, d)
    val, idx = (x @ w_true).topk(3, -1)
    lin = torch.nn.Linear(d, c)
    opt = torch.optim.Adam(lin.parameters(), lr=0.05)
    mask = torch.ones(1, 400, dtype=torch.bool)
    for _ in range(200):
        opt.zero_grad()
        out = distill_loss(lin(x)[None], idx[None], val[None], mask, fill=-1e4)
        out.loss.backward()
        opt.step()
    assert out.correct / out.frames > 0.9
    assert math.isfinite(float(out.loss.detach()))


def test_distill_on_pruned_targets_is_cross_entropy_with_the_kept_entries_renormalised():
    """targets.mass < 1: decode_topk's dropped slots weigh nothing in the loss."""
    from amflow import records
    from tasks.targets import top_entries

    torch.manual_seed(3)
    teacher, student = torch.randn(64, 30) * 3, torch.randn(64, 30)
    vals, idx = teacher.topk(8, dim=-1)
    lens = top_entries(teacher, 8, mass=0.9)[2]
    got_idx, got_val = records.decode_topk(records.encode_topk(idx.numpy(), vals.numpy(), lens))
    out = distill_loss(student[None], torch.from_numpy(got_idx)[None],
                       torch.from_numpy(got_val)[None], torch.ones(1, 64, dtype=torch.bool),
                       fill=-1e4)
    keep = torch.arange(8)[None] < torch.from_numpy(lens)[:, None]
    kept = vals.half().float().masked_fill(~keep, float("-inf")).softmax(-1)
    want = -(kept * student.log_softmax(-1).gather(-1, idx)).sum(-1).mean()
    torch.testing.assert_close(out.loss, want, rtol=1e-5, atol=1e-5)
