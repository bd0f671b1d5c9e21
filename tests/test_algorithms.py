"""The distributed algorithms on real gloo process groups (2-4 CPU processes, tiny models).

Each spawned run executes several scenarios in one group to keep process start-up cost
down; the parent compares against single-process references computed in this process.
"""
from __future__ import annotations

import copy
import io
import math

import pytest
import torch
from torch import nn

from core.config import TrainConfig
from training.algorithms import build_algorithm
from training.algorithms.bmuf import derive_eta
from training.distributed import spawn_local

IN, HID, OUT, T = 5, 6, 4, 7


class Tiny(nn.Module):
    """A small LSTM acoustic model: [B, T, IN] -> [B, T, OUT] logits."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(IN, HID, batch_first=True)
        self.output = nn.Linear(HID, OUT)

    def forward(self, x):
        return self.output(self.lstm(x)[0])


def make_model(seed: int = 0) -> Tiny:
    torch.manual_seed(seed)
    return Tiny()


def batch(step: int, rank: int, n: int = 2):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(n, T, IN, generator=g)
    y = torch.randint(0, OUT, (n, T), generator=g)
    return x, y


def loss_fn(model, x, y):
    logits = model(x)
    return nn.functional.cross_entropy(logits.reshape(-1, OUT), y.reshape(-1))


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()


def make_opt(model, kind: str, lr: float):
    if kind == "adam":
        return torch.optim.Adam(model.parameters(), lr=lr)
    if kind == "sgd_momentum":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    return torch.optim.SGD(model.parameters(), lr=lr)


def cfg(algorithm: str, **kw) -> TrainConfig:
    return TrainConfig.from_flat(algorithm=algorithm, **kw)


def train_steps(model, opt, algo, rank, steps, start=0, n=2, record=None):
    for s in range(start, start + steps):
        x, y = batch(s, rank, n)
        algo.zero_grad()
        loss_fn(model, x, y).backward()
        if record is not None:
            record.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).clone())
        algo.step(num_frames=x.shape[0] * T)


def _serialise(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _deserialise(data: bytes):
    return torch.load(io.BytesIO(data), weights_only=False)


# ---------------------------------------------------------------------------------------
# Worker functions (module level: they run in spawned processes).
# ---------------------------------------------------------------------------------------

def w_run(rank, world, scenarios):
    """Run each scenario (name, train-config kwargs, optimizer, lr, steps) in this group."""
    out = {}
    for name, algo_name, kw, opt_kind, lr, steps, n in scenarios:
        model = make_model(0)
        opt = make_opt(model, opt_kind, lr)
        algo = build_algorithm(cfg(algo_name, **kw), model, opt)
        grads: list[torch.Tensor] = []
        n_rank = n[rank] if isinstance(n, (list, tuple)) else n
        train_steps(model, opt, algo, rank, steps, n=n_rank, record=grads)
        before_final = flat(model)
        algo.finalize()
        res = {"w": flat(model), "before_final": before_final, "stats": algo.stats(),
               "grads": torch.stack(grads).sum(0)}
        if algo_name == "gtc":
            res["residual"] = algo.residual.clone()
            res["taus"] = algo.thresholds.of(torch.arange(algo.flat.total))
        if algo_name == "htm" and algo.gtc.velocity is not None:
            res["velocity_norm"] = float(algo.gtc.velocity.norm())
        if algo_name in ("bmuf",):
            res["w_g"] = algo.filter.w_g.clone()
        out[name] = res
    return out


def w_resume(rank, world, algo_name, kw, opt_kind, lr, total, split):
    """Uninterrupted run vs the same run stopped at `split`, restored from state_dict."""
    model = make_model(0)
    opt = make_opt(model, opt_kind, lr)
    algo = build_algorithm(cfg(algo_name, **kw), model, opt)
    train_steps(model, opt, algo, rank, total)
    algo.finalize()
    straight = flat(model)

    model = make_model(0)
    opt = make_opt(model, opt_kind, lr)
    algo = build_algorithm(cfg(algo_name, **kw), model, opt)
    train_steps(model, opt, algo, rank, split)
    saved = _serialise({"model": model.state_dict(), "algo": algo.state_dict()})
    del model, opt, algo
    state = _deserialise(saved)
    model = make_model(123)  # different init: everything must come from the checkpoint
    opt = make_opt(model, opt_kind, lr)
    algo = build_algorithm(cfg(algo_name, **kw), model, opt)
    model.load_state_dict(state["model"])
    algo.load_state_dict(state["algo"])
    train_steps(model, opt, algo, rank, total - split, start=split)
    algo.finalize()
    return {"straight": straight, "resumed": flat(model), "stats": algo.stats()}


def w_resume_all(rank, world, cases):
    return [w_resume(rank, world, *c) for c in cases]


# ---------------------------------------------------------------------------------------
# Single-process references.
# ---------------------------------------------------------------------------------------

def ref_big_batch(world, steps, opt_kind, lr, n):
    """One worker whose minibatch is the union of every worker's minibatch."""
    model = make_model(0)
    opt = make_opt(model, opt_kind, lr)
    for s in range(steps):
        xs, ys = zip(*[batch(s, r, n[r] if isinstance(n, list) else n) for r in range(world)])
        opt.zero_grad()
        loss_fn(model, torch.cat(xs), torch.cat(ys)).backward()
        opt.step()
    return flat(model)


def ref_bmuf(world, steps, block, zeta, eta, opt_kind, lr, lr_scale=1.0, reset=False):
    """BMUF-NBM written out with N separate models in one process."""
    models = [make_model(0) for _ in range(world)]
    opts = [make_opt(m, opt_kind, lr * lr_scale) for m in models]
    w_g = flat(models[0])
    delta = torch.zeros_like(w_g)

    def set_w(m, w):
        off = 0
        with torch.no_grad():
            for p in m.parameters():
                p.copy_(w[off:off + p.numel()].view_as(p))
                off += p.numel()

    for s in range(steps):
        for r, (m, o) in enumerate(zip(models, opts)):
            x, y = batch(s, r)
            o.zero_grad()
            loss_fn(m, x, y).backward()
            o.step()
        if (s + 1) % block == 0 or s + 1 == steps:
            w_bar = torch.stack([flat(m) for m in models]).mean(0)
            start = w_g + eta * delta  # where the workers started this block
            delta = eta * delta + zeta * (w_bar - start)
            w_g = w_g + delta
            final = s + 1 == steps
            for m in models:
                set_w(m, w_g if final else w_g + eta * delta)
            for o in opts if reset else ():
                for st in o.state.values():
                    st["momentum_buffer"].zero_()
    return w_g


def ref_gtc_momentum_correction(world, steps, tau, mu, lr):
    """GTC with momentum correction written out: per-worker velocity and residual,
    +-tau quanta of the velocity sent, sent velocities zeroed, plain SGD on the average."""
    model = make_model(0)
    params = list(model.parameters())
    n = flat(model).numel()
    u = [torch.zeros(n) for _ in range(world)]
    r = [torch.zeros(n) for _ in range(world)]
    for s in range(steps):
        update = torch.zeros(n)
        for rank in range(world):
            model.zero_grad()
            loss_fn(model, *batch(s, rank)).backward()
            g = torch.cat([p.grad.reshape(-1) for p in params])
            u[rank] = mu * u[rank] + g
            v = r[rank] + u[rank]
            sent = v.abs() >= tau
            q = torch.where(sent, torch.sign(v) * tau, torch.zeros(()))
            r[rank] = v - q
            u[rank][sent] = 0.0
            update += q
        with torch.no_grad():
            off = 0
            for p in params:
                p -= lr * (update[off:off + p.numel()] / world).view_as(p)
                off += p.numel()
    return flat(model)


# ---------------------------------------------------------------------------------------
# Tests.
# ---------------------------------------------------------------------------------------

def test_single_process_is_the_local_step():
    for name in ("sgd", "gtc", "bmuf", "htm", "ma"):
        a, b = make_model(0), make_model(0)
        oa, ob = make_opt(a, "sgd", 0.1), make_opt(b, "sgd", 0.1)
        algo = build_algorithm(cfg(name), a, oa)
        for s in range(3):
            x, y = batch(s, 0)
            algo.zero_grad()
            loss_fn(a, x, y).backward()
            algo.step(x.shape[0] * T)
            ob.zero_grad()
            loss_fn(b, x, y).backward()
            ob.step()
        algo.finalize()
        assert torch.equal(flat(a), flat(b)), name
        assert algo.bytes_sent == 0


@pytest.mark.integration
def test_two_workers_all_algorithms():
    """One 2-process group: sgd (equal and unequal batches, SGD and Adam), GTC, BMUF."""
    steps = 5
    scenarios = [
        ("sgd", "sgd", {}, "sgd", 0.5, steps, 2),
        ("sgd_adam", "sgd", {}, "adam", 0.01, steps, 2),
        ("sgd_unequal", "sgd", {}, "sgd", 0.5, steps, [1, 3]),
        ("gtc", "gtc", {"gtc_tau": 0.004}, "sgd", 1.0, steps, 2),
        ("gtc_derived", "gtc", {"gtc_tau": 0.0, "gtc_tau_scale": 2.0}, "sgd", 1.0, steps, 2),
        ("gtc_mc", "gtc", {"gtc_tau": 0.004, "gtc_momentum_correction": True},
         "sgd_momentum", 1.0, steps, 2),
        # per-tensor taus: one per parameter tensor of Tiny (4 LSTM + 2 linear)
        ("bmuf_avg", "bmuf", {"block_size": 2, "block_lr": 1.0, "block_momentum": 0.0},
         "sgd", 0.5, steps, 2),
        ("bmuf_nbm", "bmuf", {"block_size": 2}, "sgd", 0.5, steps, 2),
        ("bmuf_momentum", "bmuf", {"block_size": 2, "block_reset_momentum": False},
         "sgd_momentum", 0.5, steps, 2),
        ("bmuf_reset", "bmuf", {"block_size": 2, "block_reset_momentum": True},
         "sgd_momentum", 0.5, steps, 2),
    ]
    res = spawn_local(w_run, 2, scenarios)

    # sgd with N workers == one worker with the N-times batch
    for name, opt_kind, lr, n in (("sgd", "sgd", 0.5, 2), ("sgd_adam", "adam", 0.01, 2),
                                  ("sgd_unequal", "sgd", 0.5, [1, 3])):
        ref = ref_big_batch(2, steps, opt_kind, lr, n)
        for r in range(2):
            torch.testing.assert_close(res[r][name]["w"], ref, rtol=1e-5, atol=1e-6)
    nparams = res[0]["sgd"]["w"].numel()
    assert res[0]["sgd"]["stats"]["bytes_per_step"] == 4 * nparams + 4

    # GTC: replicas identical; the applied update is exactly what was sent, and
    # sent + residual == sum of gradients on every worker
    for name in ("gtc", "gtc_derived"):
        r0, r1 = res[0][name], res[1][name]
        torch.testing.assert_close(r0["w"], r1["w"], rtol=0, atol=0)
        assert torch.equal(r0["taus"], r1["taus"]) and bool((r0["taus"] > 0).all())
        w0 = flat(make_model(0))
        sent = [r["grads"] - r["residual"] for r in (r0, r1)]
        # with plain SGD, lr 1: W = W0 - mean over workers of everything sent
        torch.testing.assert_close(r0["w"], w0 - (sent[0] + sent[1]) / 2, rtol=0, atol=1e-5)
        # what is sent is a whole number of +-tau quanta per element
        q = sent[0] / r0["taus"]
        torch.testing.assert_close(q, q.round(), rtol=0, atol=1e-3)
        assert r0["stats"]["sent_fraction"] < 1.0

    # momentum correction: the written-out velocity/residual scheme, replicas identical
    ref = ref_gtc_momentum_correction(2, steps, 0.004, 0.9, 1.0)
    for r in range(2):
        torch.testing.assert_close(res[r]["gtc_mc"]["w"], ref, rtol=1e-5, atol=1e-6)
    assert 0 < res[0]["gtc_mc"]["stats"]["sent_fraction"] < 1.0
    assert not torch.allclose(res[0]["gtc_mc"]["w"], res[0]["gtc"]["w"])

    # BMUF with eta = 0, zeta = 1 is plain model averaging; NBM matches the equations
    ref = ref_bmuf(2, steps, 2, 1.0, 0.0, "sgd", 0.5)
    for r in range(2):
        torch.testing.assert_close(res[r]["bmuf_avg"]["w"], ref, rtol=1e-5, atol=1e-6)
    eta = derive_eta(1.0, 2, 1.0)
    assert eta == pytest.approx(0.5)
    ref = ref_bmuf(2, steps, 2, 1.0, eta, "sgd", 0.5)
    for r in range(2):
        torch.testing.assert_close(res[r]["bmuf_nbm"]["w"], ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(res[r]["bmuf_nbm"]["w"], res[r]["bmuf_nbm"]["w_g"])
    assert res[0]["bmuf_nbm"]["stats"]["blocks"] == 3  # 2 full blocks + the final partial one
    # local momentum SGD: kept across blocks, or zeroed after every block update
    for name, reset in (("bmuf_momentum", False), ("bmuf_reset", True)):
        ref = ref_bmuf(2, steps, 2, 1.0, eta, "sgd_momentum", 0.5, reset=reset)
        for r in range(2):
            torch.testing.assert_close(res[r][name]["w"], ref, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(res[0]["bmuf_momentum"]["w"], res[0]["bmuf_reset"]["w"])


@pytest.mark.integration
def test_htm_special_cases_and_ma():
    """HTM with group_size 1 == BMUF, with one group == GTC; MA vs its reference."""
    steps = 5
    scenarios = [
        ("bmuf", "bmuf", {"block_size": 2}, "sgd", 0.5, steps, 2),
        ("htm1", "htm", {"block_size": 2, "group_size": 1}, "sgd", 0.5, steps, 2),
        ("bmuf_reset", "bmuf", {"block_size": 2, "block_reset_momentum": True},
         "sgd_momentum", 0.5, steps, 2),
        ("htm1_reset", "htm", {"block_size": 2, "group_size": 1, "block_reset_momentum": True},
         "sgd_momentum", 0.5, steps, 2),
        ("gtc", "gtc", {"gtc_tau": 0.004}, "sgd", 1.0, steps, 2),
        ("htm2", "htm", {"block_size": 2, "group_size": 2, "gtc_tau": 0.004}, "sgd", 1.0,
         steps, 2),
        ("gtc_mc", "gtc", {"gtc_tau": 0.004, "gtc_momentum_correction": True,
                            "gtc_warmup": 3}, "sgd_momentum", 1.0, steps, 2),
        # (the warm-up starts at tau / tau_scale: HTM's lower tier uses htm_tau_scale)
        ("htm2_mc", "htm", {"block_size": 2, "group_size": 2, "gtc_tau": 0.004,
                            "gtc_momentum_correction": True, "gtc_warmup": 3,
                            "htm_tau_scale": 100.0},
         "sgd_momentum", 1.0, steps, 2),
        ("ma", "ma", {"ma_samples": 2 * 2 * T, "minibatch_frames": 2 * T, "max_change": 0.05},
         "sgd", 0.25, steps, 2),
    ]
    res = spawn_local(w_run, 2, scenarios)
    for r in range(2):
        torch.testing.assert_close(res[r]["htm1"]["w"], res[r]["bmuf"]["w"], rtol=0, atol=1e-7)
        torch.testing.assert_close(res[r]["htm1_reset"]["w"], res[r]["bmuf_reset"]["w"],
                                   rtol=0, atol=1e-7)
        torch.testing.assert_close(res[r]["htm2"]["w"], res[r]["gtc"]["w"], rtol=0, atol=0)
        # HTM hands the GTC knobs (warm-up, momentum correction) to its lower tier
        torch.testing.assert_close(res[r]["htm2_mc"]["w"], res[r]["gtc_mc"]["w"], rtol=0,
                                   atol=0)
    assert not torch.allclose(res[0]["gtc_mc"]["w"], res[0]["gtc"]["w"])
    assert res[0]["htm1"]["stats"]["eta"] == res[0]["bmuf"]["stats"]["eta"] == 0.5
    assert res[0]["htm2"]["stats"]["bytes_sent"] == res[0]["gtc"]["stats"]["bytes_sent"]
    # MA: every 2 minibatches an average; lr x N; final models identical
    ma = res[0]["ma"]["stats"]
    assert ma["period"] == 2 and ma["averages"] == 3 and ma["lr_scale"] == 2.0
    torch.testing.assert_close(res[0]["ma"]["w"], res[1]["ma"]["w"], rtol=0, atol=0)


def _ma_reference(world, steps, period, lr, max_change):
    models = [make_model(0) for _ in range(world)]
    opts = [make_opt(m, "sgd", lr * world) for m in models]
    for s in range(steps):
        for r, (m, o) in enumerate(zip(models, opts)):
            x, y = batch(s, r)
            before = [p.detach().clone() for p in m.parameters()]
            o.zero_grad()
            loss_fn(m, x, y).backward()
            o.step()
            with torch.no_grad():
                for p, b in zip(m.parameters(), before):
                    d = p - b
                    nrm = d.norm()
                    if nrm > max_change:
                        p.copy_(b + d * (max_change / nrm))
        if (s + 1) % period == 0 or s + 1 == steps:
            avg = torch.stack([flat(m) for m in models]).mean(0)
            for m in models:
                off = 0
                with torch.no_grad():
                    for p in m.parameters():
                        p.copy_(avg[off:off + p.numel()].view_as(p))
                        off += p.numel()
    return flat(models[0])


@pytest.mark.integration
def test_ma_matches_reference():
    steps = 5
    kw = {"ma_samples": 2 * 2 * T, "minibatch_frames": 2 * T, "max_change": 0.05}
    res = spawn_local(w_run, 2, [("ma", "ma", kw, "sgd", 0.25, steps, 2)])
    ref = _ma_reference(2, steps, 2, 0.25, 0.05)
    torch.testing.assert_close(res[0]["ma"]["w"], ref, rtol=1e-5, atol=1e-6)
    assert res[0]["ma"]["stats"]["clipped"] > 0  # the cap was active


@pytest.mark.integration
def test_resume_equals_uninterrupted():
    cases = [
        ("sgd", {}, "adam", 0.01, 6, 3),
        ("gtc", {"gtc_tau": 0.0, "gtc_tau_scale": 2.0}, "adam", 0.01, 6, 3),
        ("gtc", {"gtc_tau": 0.0, "gtc_tau_scale": 2.0, "gtc_momentum_correction": True},
         "sgd_momentum", 0.1, 6, 3),
        ("bmuf", {"block_size": 2}, "adam", 0.01, 7, 3),
        ("htm", {"block_size": 2, "group_size": 1}, "adam", 0.01, 7, 3),
        ("ma", {"ma_samples": 4 * T, "minibatch_frames": 2 * T}, "adam", 0.01, 7, 3),
        ("ma", {"ma_samples": 4 * T, "minibatch_frames": 2 * T, "natural_gradient": True},
         "sgd", 0.1, 14, 11),  # past the first 10 minibatches: Fisher updates every 4th
    ]
    res = spawn_local(w_resume_all, 2, cases)
    for r in range(2):
        for (name, kw, *_), out in zip(cases, res[r]):
            torch.testing.assert_close(out["resumed"], out["straight"], rtol=0, atol=0,
                                       msg=f"{name} {kw}")


@pytest.mark.integration
@pytest.mark.slow
def test_htm_four_workers_two_groups():
    """4 workers, 2 groups of 2: replicas agree within a group every step (GTC), across
    groups after each block, and everyone ends on W_g."""
    steps = 5
    mc = {"block_size": 2, "group_size": 2, "gtc_tau": 0.004, "gtc_momentum_correction": True}
    scenarios = [("htm", "htm", {"block_size": 2, "group_size": 2, "gtc_tau": 0.004},
                  "sgd", 0.5, steps, 2),
                 ("htm_mc", "htm", dict(mc, block_reset_momentum=True), "sgd_momentum", 0.5,
                  steps, 2),
                 ("htm_mc_keep", "htm", dict(mc, block_reset_momentum=False), "sgd_momentum",
                  0.5, steps, 2)]
    res = spawn_local(w_run, 4, scenarios)
    # the block reset zeroes the momentum wherever it lives: with momentum correction, in
    # GTC's velocity (the last block ended at finalize)
    for r in range(4):
        assert res[r]["htm_mc"]["velocity_norm"] == 0.0
        assert res[r]["htm_mc_keep"]["velocity_norm"] > 0.0
    ws = [res[r]["htm"]["w"] for r in range(4)]
    for w in ws[1:]:
        torch.testing.assert_close(w, ws[0], rtol=0, atol=0)
    st = res[0]["htm"]["stats"]
    assert st["groups"] == 2 and st["eta"] == pytest.approx(derive_eta(1.0, 2, 1.0))
    assert res[1]["htm"]["stats"]["block_bytes"] == 0  # non-leaders only receive


def test_gtc_momentum_correction_needs_momentum_sgd():
    """Adam has no momentum to take over: a clear error naming the key, not a silent no-op.
    One process needs no compression, so the setting is accepted there."""
    import torch.distributed as dist
    from training.algorithms.gtc import take_over_momentum
    model = make_model(0)
    with pytest.raises(ValueError, match="gtc_momentum_correction"):
        take_over_momentum(make_opt(model, "adam", 0.01))
    opt = make_opt(model, "sgd_momentum", 0.1)
    assert take_over_momentum(opt) == pytest.approx(0.9)
    assert opt.param_groups[0]["momentum"] == 0.0
    assert not dist.is_initialized()
    build_algorithm(cfg("gtc", gtc_momentum_correction=True), model, make_opt(model, "adam", 0.01))
