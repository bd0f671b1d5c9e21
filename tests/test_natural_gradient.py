"""Online natural gradient (Kaldi NG-SGD): the Fisher factor, the capture of per-frame
inputs and derivatives, and its use inside the ma trainer."""
from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from training.models import StudentLSTM
from training.natural_gradient import NaturalGradient, OnlineFisher


def _rows(rng: torch.Generator, n: int, dim: int, loud: torch.Tensor) -> torch.Tensor:
    """Rows with unit variance everywhere plus a x10 standard deviation along `loud`."""
    x = torch.randn(n, dim, generator=rng)
    return x + 9.0 * torch.randn(n, 1, generator=rng) * loud


def test_online_fisher_finds_the_loud_direction_and_damps_it():
    dim, rng = 40, torch.Generator().manual_seed(0)
    loud = torch.zeros(dim)
    loud[3] = 1.0
    f = OnlineFisher(dim, rank=5, samples=500.0)
    for _ in range(30):
        X = _rows(rng, 128, dim, loud)
        Xbar = f.precondition(X)
        assert math.isclose(float(Xbar.norm()), float(X.norm()), rel_tol=1e-4)
    gram = f.R @ f.R.T
    torch.testing.assert_close(gram, torch.eye(5), atol=1e-4, rtol=0)
    assert abs(float(f.R[0] @ loud)) > 0.99 and f.rho > 0 and bool((f.d >= 0).all())
    # the loud direction's share of the energy drops; the others' share grows
    X = _rows(rng, 256, dim, loud)
    Xbar = f.precondition(X)
    share = (X[:, 3] ** 2).sum() / (X ** 2).sum()
    share_bar = (Xbar[:, 3] ** 2).sum() / (Xbar ** 2).sum()
    assert float(share) > 0.6 and float(share_bar) < 0.5 * float(share)


def test_online_fisher_state_round_trip_continues_identically():
    dim, rng = 12, torch.Generator().manual_seed(1)
    batches = [torch.randn(32, dim, generator=rng) for _ in range(14)]
    a = OnlineFisher(dim, rank=3)
    for X in batches[:9]:
        a.precondition(X)
    b = OnlineFisher(dim, rank=3)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    for X in batches[9:]:
        torch.testing.assert_close(a.precondition(X), b.precondition(X), rtol=0, atol=0)


def _grads(model, x, y, ng=None):
    model.zero_grad()
    out = model(x)
    nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1)).backward()
    if ng is not None:
        assert ng.precondition() == 3  # two LSTM layers and the output layer
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_capture_reproduces_autograd_when_the_fisher_is_flat():
    """With a huge alpha every factor is ~ a multiple of I, so the rebuilt gradient
    sum_t g_t [x_t, h_t-1, 1]^T must equal autograd's: the per-frame rows are right."""
    torch.manual_seed(0)
    plain = StudentLSTM(10, 16, 2, 7, lookahead=2)
    model = copy.deepcopy(plain)
    ng = NaturalGradient(model, alpha=1e9)
    x, y = torch.randn(3, 12, 10), torch.randint(0, 7, (3, 12))
    out0, g0 = _grads(plain, x, y)
    out1, g1 = _grads(model, x, y, ng)
    torch.testing.assert_close(out1, out0, rtol=0, atol=1e-6)  # same forward
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], rtol=1e-4, atol=1e-7, msg=name)
    model.eval()
    with torch.no_grad():  # eval runs the fused path, captures nothing
        torch.testing.assert_close(model(x), out0, rtol=0, atol=1e-6)
    assert all(not a.rows for a in ng.affines.values())
    ng.detach()
    assert "forward" not in vars(model.lstm)


def test_natural_gradient_changes_direction_not_scale():
    torch.manual_seed(0)
    plain = StudentLSTM(10, 16, 2, 7, lookahead=0)
    model = copy.deepcopy(plain)
    ng = NaturalGradient(model)
    x, y = torch.randn(4, 20, 10) * 3, torch.randint(0, 7, (4, 20))
    _, g0 = _grads(plain, x, y)
    _, g1 = _grads(model, x, y, ng)
    w0, w1 = g0["lstm.weight_hh_l0"], g1["lstm.weight_hh_l0"]
    cos = float((w0 * w1).sum() / (w0.norm() * w1.norm()))
    assert 0.3 < cos < 0.9999  # a different direction, still a descent-like one
    assert 0.1 < float(w1.norm() / w0.norm()) < 10


def test_rejects_models_it_cannot_precondition():
    with pytest.raises(ValueError, match="unidirectional"):
        NaturalGradient(nn.LSTM(4, 4, bidirectional=True, batch_first=True))
    with pytest.raises(ValueError, match="no nn.Linear"):
        NaturalGradient(nn.Sequential(nn.ReLU()))


def test_config_names_the_key():
    from core.config import ConfigError, TrainConfig

    bad = TrainConfig.from_flat(algorithm="sgd", natural_gradient=True)
    with pytest.raises(ConfigError, match="train.natural_gradient"):
        bad.validate("train")
    bad = TrainConfig.from_flat(algorithm="ma", natural_gradient=True, model="teacher")
    with pytest.raises(ConfigError, match="train.natural_gradient"):
        bad.validate("train")
    TrainConfig.from_flat(algorithm="ma", natural_gradient=True).validate("train")


def test_ma_with_natural_gradient_learns():
    """One-process ma + NG on a learnable toy task: the loss falls faster than plain ma."""
    from core.config import TrainConfig
    from training.algorithms import build_algorithm

    def run(ng: bool) -> tuple[float, float]:
        torch.manual_seed(0)
        model = StudentLSTM(6, 12, 1, 4, lookahead=0)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        algo = build_algorithm(TrainConfig.from_flat(algorithm="ma", natural_gradient=ng,
                                           minibatch_frames=64), model, opt, world_size=1)
        gen = torch.Generator().manual_seed(1)
        losses = []
        for _ in range(60):
            x = torch.randn(4, 16, 6, generator=gen)
            y = (x[..., 0] > 0).long() + 2 * (x[..., 1] > 0).long()
            algo.zero_grad()
            loss = nn.functional.cross_entropy(model(x).reshape(-1, 4), y.reshape(-1))
            loss.backward()
            algo.step(num_frames=64)
            losses.append(loss.item())
        assert algo.stats()["natural_gradient"] == ng
        return sum(losses[:5]) / 5, sum(losses[-5:]) / 5

    first, last = run(True)
    _, last_plain = run(False)
    assert last < 0.5 * first and last < last_plain  # 0.64 against 0.90 when written
