"""Kaldi's online natural-gradient preconditioning (NG-SGD; Povey, Zhang & Khudanpur 2014).

The Fisher matrix of each weight matrix W (output x input, bias as an extra input column)
is approximated by a Kronecker product A (x) B of two factors: A the covariance of the
per-frame derivatives w.r.t. W's output, B the covariance of W's per-frame inputs. Each
factor is "low rank plus a multiple of the identity", F = R^T D R + rho I, tracked online
over past minibatches with forgetting factor eta = 1 - exp(-N / samples) (the paper's
appendix B). The gradient sum_t g_t y_t^T is replaced by sum_t g~_t y~_t^T with
g~ = gamma g G_A^-1 and y~ = gamma y G_B^-1, G = F + alpha tr(F)/D I, and gamma keeping
each matrix's Frobenius norm, so the step size stays the plain SGD one and only its
direction changes: directions with much variance get smaller steps.

Which matrices: every `nn.Linear` and every layer of every unidirectional `nn.LSTM`
(one affine over [x_t, h_t-1, 1] onto the four gates' pre-activations, as a Kaldi LSTM
is built). The per-frame gate derivatives of a fused LSTM are not observable, so while
training with gradients on, an LSTM layer's input projection is computed outside the
fused kernel (x W_ih^T, whose gradient is exactly the gate derivatives) and fed to the
fused recurrence through identity input weights; outputs are unchanged. In eval mode or
under `torch.no_grad` the model runs its normal fused path.

    ng = NaturalGradient(model)        # attaches; ng.detach() restores the model
    loss.backward(); ng.precondition(); optimizer.step()
"""
from __future__ import annotations

import functools
import math
from typing import Any

import torch
from torch import nn

from training.models import lstm_layer_template

EPS = 1e-10


class OnlineFisher:
    """One Fisher factor: `precondition(X)` multiplies the rows of X by the inverse of the
    smoothed estimate from earlier minibatches, rescales to X's norm, then updates it."""

    def __init__(self, dim: int, rank: int, alpha: float = 4.0, samples: float = 2000.0,
                 update_period: int = 4):
        self.dim = int(dim)
        self.rank = max(0, min(int(rank), self.dim - 1))
        self.alpha = float(alpha)
        self.samples = float(samples)
        self.period = max(1, int(update_period))
        self.t = 0
        self.R: torch.Tensor | None = None  # rank x dim, orthonormal rows
        self.d: torch.Tensor | None = None  # rank, >= 0
        self.rho = 0.0

    def precondition(self, X: torch.Tensor) -> torch.Tensor:
        X = X.detach().float()
        if self.rank == 0 or X.shape[0] == 0:
            return X
        if self.R is None:
            self._init(X)
        out = self._apply(X)
        if self.t < 10 or self.t % self.period == 0:
            self._update(X)
        self.t += 1
        return out

    def _init(self, X: torch.Tensor) -> None:
        S = X.T @ X / X.shape[0]
        lam, vec = torch.linalg.eigh(S.double())
        lam, vec = lam.flip(0)[:self.rank], vec.flip(1)[:, :self.rank]
        self.rho = max(float((torch.trace(S.double()) - lam.sum()) / (self.dim - self.rank)),
                       EPS)
        self.R = vec.T.float().contiguous()
        self.d = (lam - self.rho).clamp_min(EPS).float()

    def _apply(self, X: torch.Tensor) -> torch.Tensor:
        beta = self.rho * (1 + self.alpha) + self.alpha / self.dim * float(self.d.sum())
        e = 1.0 / (beta / self.d + 1.0)
        W = e.sqrt()[:, None] * self.R
        Xhat = X - (X @ W.T) @ W
        den = float((Xhat * Xhat).sum())
        gamma = math.sqrt(float((X * X).sum()) / den) if den > 0 else 1.0
        return Xhat * gamma

    def _update(self, X: torch.Tensor) -> None:
        n = X.shape[0]
        eta = 1.0 - math.exp(-n / self.samples)
        # the N x D products in float32; only the small R x R algebra in float64
        Y = (eta / n) * ((self.R @ X.T) @ X).double() \
            + (1 - eta) * (self.d.double()[:, None] + self.rho) * self.R.double()
        C, U = torch.linalg.eigh(Y @ Y.T)
        C, U = C.flip(0).clamp_min(EPS), U.flip(1)  # largest first
        root = C.sqrt()
        R_new = (U.T @ Y) / root[:, None]
        tr_s = float((X * X).sum()) / n
        rho = (eta * tr_s + (1 - eta) * (self.dim * self.rho + float(self.d.sum()))
               - float(root.sum())) / (self.dim - self.rank)
        self.rho = max(rho, EPS)
        gram = R_new @ R_new.T
        if float((gram - torch.eye(self.rank, dtype=gram.dtype)).abs().max()) > 1e-3:
            R_new = torch.linalg.qr(R_new.T).Q.T  # roundoff lost orthogonality (B.3.1)
        self.R = R_new.float().contiguous()
        self.d = (root - self.rho).clamp_min(EPS).float()

    def state_dict(self) -> dict[str, Any]:
        return {"t": self.t, "R": self.R, "d": self.d, "rho": self.rho}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.t, self.R, self.d, self.rho = state["t"], state["R"], state["d"], state["rho"]


@functools.cache
def _eye(n: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    return torch.eye(n, dtype=dtype, device=device)


class _Affine:
    """Captured rows of one weight matrix and its two Fisher factors."""

    def __init__(self, out_dim: int, in_dim: int, ranks: tuple[int, int], kw: dict):
        self.out = OnlineFisher(out_dim, ranks[1], **kw)
        self.inp = OnlineFisher(in_dim + 1, ranks[0], **kw)  # + the bias column
        self.rows: list[tuple[torch.Tensor, dict]] = []  # (inputs, {"g": output derivs})

    def capture(self, inputs: torch.Tensor, out: torch.Tensor) -> None:
        box: dict = {}
        out.register_hook(lambda g: box.__setitem__("g", g))
        self.rows.append((inputs.detach(), box))

    def gradient(self) -> torch.Tensor | None:
        """Preconditioned [out, in + 1] gradient of the captured frames, or None."""
        pairs = [(y, box["g"]) for y, box in self.rows if "g" in box]
        self.rows = []
        if not pairs:
            return None
        Y = torch.cat([y.reshape(-1, y.shape[-1]) for y, _ in pairs]).float()
        G = torch.cat([g.reshape(-1, g.shape[-1]) for _, g in pairs]).float()
        live = G.abs().amax(1) > 0  # padding and masked frames carry no derivative
        Y, G = Y[live], G[live]
        Y = torch.cat([Y, torch.ones(len(Y), 1, dtype=Y.dtype, device=Y.device)], 1)
        return self.out.precondition(G).T @ self.inp.precondition(Y)


class NaturalGradient:
    """Online NG-SGD for every nn.Linear and unidirectional nn.LSTM layer of `model`.

    Ranks as Kaldi's default: 20 on the input side, 80 on the output side.
    """

    def __init__(self, model: nn.Module, rank_in: int = 20, rank_out: int = 80,
                 alpha: float = 4.0, samples: float = 2000.0, update_period: int = 4):
        kw = {"alpha": alpha, "samples": samples, "update_period": update_period}
        self.affines: dict[str, _Affine] = {}
        self._handles: list[Any] = []
        self._patched: list[nn.LSTM] = []
        self._targets: dict[str, tuple[nn.Module, int]] = {}
        for name, mod in model.named_modules():
            if isinstance(mod, nn.Linear):
                self.affines[name] = _Affine(mod.out_features, mod.in_features,
                                             (rank_in, rank_out), kw)
                self._targets[name] = (mod, -1)
                self._handles.append(mod.register_forward_hook(self._linear_hook(name)))
            elif isinstance(mod, nn.LSTM):
                if mod.bidirectional or mod.proj_size or not mod.batch_first or not mod.bias:
                    raise ValueError(f"natural gradient: LSTM {name!r} must be unidirectional, "
                                     "batch-first, with biases and no projection")
                for layer in range(mod.num_layers):
                    inp = mod.input_size if layer == 0 else mod.hidden_size
                    key = f"{name}.l{layer}"
                    self.affines[key] = _Affine(4 * mod.hidden_size, inp + mod.hidden_size,
                                                (rank_in, rank_out), kw)
                    self._targets[key] = (mod, layer)
                mod.forward = functools.partial(self._lstm_forward, mod, name,
                                                mod.forward)
                self._patched.append(mod)
        if not self.affines:
            raise ValueError("natural gradient: the model has no nn.Linear or nn.LSTM")

    @staticmethod
    def _capturing(mod: nn.Module) -> bool:
        return mod.training and torch.is_grad_enabled()

    def _linear_hook(self, name: str):
        def hook(mod: nn.Module, args: tuple, out: torch.Tensor) -> None:
            if self._capturing(mod) and out.requires_grad:
                self.affines[name].capture(args[0], out)
        return hook

    def _lstm_forward(self, mod: nn.LSTM, name: str, fused, x: torch.Tensor, hx=None):
        if not self._capturing(mod) or hx is not None:
            return fused(x, hx)
        h_n, c_n = [], []
        for layer in range(mod.num_layers):
            if layer and mod.dropout:
                x = nn.functional.dropout(x, mod.dropout, training=True)
            w_ih = getattr(mod, f"weight_ih_l{layer}")
            pre = x @ w_ih.T  # its gradient is the gates' derivative, frame by frame
            # a one-layer shell over 4H inputs given an identity input matrix, so the
            # pre-computed input projection passes straight through
            shell = lstm_layer_template(4 * mod.hidden_size, mod.hidden_size, True, pre.dtype)
            y, (h, c) = torch.func.functional_call(shell, {
                    "weight_ih_l0": _eye(4 * mod.hidden_size, pre.dtype, str(pre.device)),
                    "weight_hh_l0": getattr(mod, f"weight_hh_l{layer}"),
                    "bias_ih_l0": getattr(mod, f"bias_ih_l{layer}"),
                    "bias_hh_l0": getattr(mod, f"bias_hh_l{layer}")}, (pre,))
            if pre.requires_grad:
                h_prev = nn.functional.pad(y[:, :-1], (0, 0, 1, 0))  # zero initial state
                self.affines[f"{name}.l{layer}"].capture(torch.cat([x, h_prev], -1), pre)
            h_n.append(h)
            c_n.append(c)
            x = y
        return x, (torch.cat(h_n), torch.cat(c_n))

    @torch.no_grad()
    def precondition(self) -> int:
        """Replace the gradients of the captured matrices; returns how many were."""
        done = 0
        for key, aff in self.affines.items():
            full = aff.gradient()
            if full is None:
                continue
            mod, layer = self._targets[key]
            if layer < 0:
                _set_grad(mod.weight, full[:, :-1])
                if mod.bias is not None:
                    _set_grad(mod.bias, full[:, -1])
            else:
                n_in = getattr(mod, f"weight_ih_l{layer}").shape[1]
                _set_grad(getattr(mod, f"weight_ih_l{layer}"), full[:, :n_in])
                _set_grad(getattr(mod, f"weight_hh_l{layer}"), full[:, n_in:-1])
                # both bias vectors receive the gates' bias gradient, as autograd gives them
                _set_grad(getattr(mod, f"bias_ih_l{layer}"), full[:, -1])
                _set_grad(getattr(mod, f"bias_hh_l{layer}"), full[:, -1])
            done += 1
        return done

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        for mod in self._patched:
            del mod.forward
        self._handles, self._patched = [], []

    def state_dict(self) -> dict[str, Any]:
        return {k: {"out": a.out.state_dict(), "inp": a.inp.state_dict()}
                for k, a in self.affines.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k, s in state.items():
            self.affines[k].out.load_state_dict(s["out"])
            self.affines[k].inp.load_state_dict(s["inp"])


def _set_grad(p: torch.Tensor, g: torch.Tensor) -> None:
    if p.grad is None:
        p.grad = g.to(p.dtype).clone()
    else:
        p.grad.copy_(g)
