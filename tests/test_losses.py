"""Criteria: CE with ignored frames, exact top-k distillation, temperature."""
import math

import pytest
import torch
import torch.nn.functional as F

from training.losses import IGNORE, ce_loss, distill_loss, phone_matrix, teacher_probs

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
    from core import records
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


# ---- train.phone_weight: the criterion on each frame's phone (context-dependent classes)
CLASS_PHONE = torch.tensor([0, 0, 1, 2, 2, 2])  # 6 leaves of 3 phones
TO_PHONE = phone_matrix(CLASS_PHONE)


def test_phone_log_probs_sum_the_leaves_of_each_phone():
    from training.losses import phone_log_probs
    logits = torch.randn(7, 6) * 30  # spread wide: the shift must keep the sums exact
    q = torch.softmax(logits.double(), -1)
    want = torch.stack([q[:, CLASS_PHONE == p].sum(-1) for p in range(3)], -1).log()
    got = phone_log_probs(logits.double(), TO_PHONE)
    assert torch.allclose(got.exp(), want.exp(), atol=1e-12)
    assert torch.allclose(got.logsumexp(-1), torch.zeros(7, dtype=torch.float64), atol=1e-9)


def test_phone_loss_is_the_senone_loss_less_the_choice_among_a_phones_leaves():
    # -log q(leaf) = -log q(phone) - log q(leaf | phone), frame by frame.
    from training.losses import phone_loss
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 6, dtype=torch.float64)
    labels = torch.randint(0, 6, (2, 5))
    labels[1, 3:] = IGNORE
    keep = labels != IGNORE
    logq = torch.log_softmax(logits, -1)[keep]
    lab = labels[keep]
    same = CLASS_PHONE[None, :] == CLASS_PHONE[lab][:, None]
    within = logq.gather(-1, lab[:, None])[:, 0] - logq.masked_fill(~same, -math.inf).logsumexp(-1)
    got = phone_loss(logits, TO_PHONE, labels=labels)
    assert math.isclose(float(ce_loss(logits, labels).loss), float(got - within.mean()),
                        rel_tol=1e-12)


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_phone_loss_with_one_leaf_per_phone_is_the_class_criterion(temperature):
    from training.losses import phone_loss
    torch.manual_seed(1)
    logits = torch.randn(2, 4, 5, dtype=torch.float64)
    one = torch.arange(5)
    labels = torch.randint(0, 5, (2, 4))
    assert math.isclose(float(phone_loss(logits, phone_matrix(one), labels=labels)),
                        float(ce_loss(logits, labels).loss), rel_tol=1e-12)
    idx = torch.stack([torch.randperm(5)[:3] for _ in range(8)]).view(2, 4, 3)
    val = torch.randn(2, 4, 3) * 3
    mask = torch.ones(2, 4, dtype=torch.bool)
    mask[0, 0] = False
    got = phone_loss(logits, phone_matrix(one), topk_idx=idx, topk_logit=val, mask=mask, fill=-8.0,
                     temperature=temperature)
    want = distill_loss(logits, idx, val, mask, fill=-8.0, temperature=temperature).loss
    assert math.isclose(float(got), float(want), rel_tol=1e-6)


def test_phone_loss_against_the_teacher_sums_its_posterior_per_phone():
    from training.losses import phone_log_probs, phone_loss
    logits = torch.randn(1, 3, 6, dtype=torch.float64)
    idx = torch.tensor([[[0, 2, 3], [1, 4, 5], [3, 4, 5]]])
    val = torch.tensor([[[2.0, 1.0, 0.0], [0.5, 0.5, 3.0], [1.0, 1.0, 1.0]]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    teacher = teacher_probs(idx, val, 6, fill=-1e4)[0].double()
    tp = torch.stack([teacher[:, CLASS_PHONE == p].sum(-1) for p in range(3)], -1)
    want = -(tp * phone_log_probs(logits[0], TO_PHONE)).sum(-1).mean()
    got = phone_loss(logits, TO_PHONE, topk_idx=idx, topk_logit=val, mask=mask)
    assert math.isclose(float(got), float(want), rel_tol=1e-6)
