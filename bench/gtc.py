"""`amflow bench gtc`: GTC codec throughput and every algorithm's per-minibatch overhead.

1. Codec. The papers' student (5 x 768 unidirectional LSTM on 192-d input, 3183 outputs:
   ~24 M parameters) is run forward and backward on a few random chunks to get real
   gradients. On one core (torch threads = 1) we time, per minibatch, GTC's encode
   (residual += g, threshold, compact, pack) and the decode of the resulting buffer into
   a dense gradient (zero + index_add), timed in this thread's CPU time (the work of one
   core, whatever else shares the machine; wall-clock GB/s is reported beside), over a sequence of minibatches whose gradients are
   those real gradients with per-minibatch random gains (so the residual reaches its
   working regime). Reported: gradient GB/s (4 bytes per parameter / (encode + decode)),
   the sent fraction and the compression against dense fp32 (4P bytes / code bytes),
   with taus derived as in training (per tensor: gtc_tau_scale x mean |first gradient|).
2. Overheads. Two gloo processes hold the same 24 M model; each minibatch sets the
   gradients from stored real gradients (no forward/backward, so the figure is the
   algorithm alone) and calls `algo.step()`; a bare Adam step on a second copy of the
   model is timed in the same minibatch, just before (interleaved, so both see the same
   machine load). Reported per algorithm: mean time per minibatch (amortising BMUF's and
   MA's periodic syncs) relative to the bare step (overhead = ratio - 1), the algorithm's
   own seconds (codec + communication, `comm_seconds`) relative to the bare step, and
   bytes per minibatch. The total also holds effects on the local step itself: Adam on
   GTC's sparse decoded gradients runs ~2x slower on a CPU than on dense ones (measured
   in isolation), and MA's max-change reads the model twice more per minibatch.
   Two processes on this machine share its cores, so the overhead includes the CPU time
   of local gloo transfers; on GPUs with NVLink the communication term is far smaller.

Config: bench.gtc_steps (codec minibatches, default 160: the sent fraction settles after
~gtc_tau_scale minibatches, and only the second half is counted), bench.overhead_steps
(0, the default: train.block_size + 10).
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time
from typing import Any

import torch
from torch import nn

from core.config import Config, TrainConfig
from training.algorithms import build_algorithm
from training.algorithms.gtc import Thresholds, decode_add_, encode_, padded_bool
from training.distributed import spawn_local
from training.models import StudentLSTM

PAPER_MODEL = {"input_dim": 192, "hidden": 768, "layers": 5, "num_classes": 3183}


def paper_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    m = PAPER_MODEL
    return StudentLSTM(m["input_dim"], m["hidden"], m["layers"], m["num_classes"], lookahead=3)


def real_gradients(model: nn.Module, count: int, chunks: int = 4, frames: int = 32,
                   seed: int = 0) -> list[torch.Tensor]:
    """Flat fp32 gradients of cross-entropy on random chunks (one per element)."""
    params = [p for p in model.parameters() if p.requires_grad]
    out = []
    g = torch.Generator().manual_seed(seed)
    c = PAPER_MODEL["num_classes"]
    for _ in range(count):
        x = torch.randn(chunks, frames, PAPER_MODEL["input_dim"], generator=g)
        y = torch.randint(0, c, (chunks, frames), generator=g)
        model.zero_grad(set_to_none=False)
        loss = nn.functional.cross_entropy(model(x).reshape(-1, c), y.reshape(-1))
        loss.backward()
        out.append(torch.cat([p.grad.reshape(-1) for p in params]).clone())
    return out


def codec_bench(grads: list[torch.Tensor], sizes: list[int], steps: int,
                tau_scale: float) -> dict[str, Any]:
    torch.set_num_threads(1)
    n = grads[0].numel()
    residual = torch.zeros(n)
    dense = torch.zeros(n)
    mask, scratch = padded_bool(n, residual.device), padded_bool(n, residual.device)
    tau = Thresholds(sizes, [tau_scale * float(p.abs().mean()) for p in grads[0].split(sizes)])
    gen = torch.Generator().manual_seed(1)
    enc_t, dec_t, sent, wall_t = [], [], [], []
    g = torch.empty(n)
    for step in range(steps):
        gain = float(torch.empty(()).uniform_(0.5, 1.5, generator=gen))
        torch.mul(grads[step % len(grads)], gain, out=g)
        # CPU time of this thread (torch and numpy run the codec on it with 1 thread): the
        # work of one core, unaffected by other processes sharing the machine's cores
        w0, t0 = time.perf_counter(), time.thread_time()
        codes = encode_(residual, g, tau, mask, scratch)
        t1 = time.thread_time()
        dense.zero_()
        decode_add_(dense, codes, tau)
        t2, w2 = time.thread_time(), time.perf_counter()
        enc_t.append(t1 - t0)
        dec_t.append(t2 - t1)
        wall_t.append(w2 - w0)
        sent.append(codes.numel())
    # The residual needs ~gtc_tau_scale minibatches to reach its working regime (an
    # element of typical |g| crosses tau after ~tau / |g| of them): time and count the
    # second half only.
    warm = max(steps // 2, 1)
    e, d = statistics.median(enc_t[warm:]), statistics.median(dec_t[warm:])
    s = sum(sent[warm:]) / len(sent[warm:])
    return {"params": n, "tau_median": float(tau.taus.median()), "tau_scale": tau_scale,
            "tensors": len(sizes), "steps": steps,
            "encode_ms": round(e * 1e3, 2), "decode_ms": round(d * 1e3, 2),
            "gb_per_s": round(4 * n / (e + d) / 1e9, 3),
            "timing": "thread CPU time (one core's work)",
            "wall_gb_per_s": round(4 * n / statistics.median(wall_t[warm:]) / 1e9, 3),
            "encode_gb_per_s": round(4 * n / e / 1e9, 3),
            "sent_fraction": s / n, "sent_per_step": s,
            "compression_vs_fp32": round(4 * n / max(4 * s + 8, 1), 1),
            "sent_fraction_by_step": [round(x / n, 6) for x in sent]}


def _set_grads(params: list[torch.Tensor], flat: torch.Tensor) -> None:
    off = 0
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        p.grad.copy_(flat[off:off + p.numel()].view_as(p))
        off += p.numel()


def _overhead_worker(rank: int, world: int, grads_path: str, algos: list[str],
                     steps: int, train_kw: dict) -> dict[str, Any]:
    """Per algorithm, interleave step by step a bare Adam step on one model and the
    algorithm's step on another, so that both see the same machine load."""
    grads = torch.load(grads_path)
    bare_model = paper_model(0)
    bare_params = [p for p in bare_model.parameters() if p.requires_grad]
    bare_opt = torch.optim.Adam(bare_params, lr=1e-4)
    out: dict[str, Any] = {}
    for name in algos:
        model = paper_model(0)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.Adam(params, lr=1e-4)
        tc = TrainConfig.from_flat(algorithm=name, **train_kw)
        algo = build_algorithm(tc, model, opt)
        bare_t, algo_t = [], []
        for step in range(steps):
            flat = grads[(step + rank) % len(grads)]
            _set_grads(bare_params, flat)
            _set_grads(params, flat)
            torch.distributed.barrier()
            t0 = time.perf_counter()
            bare_opt.step()
            bare_t.append(time.perf_counter() - t0)
            torch.distributed.barrier()
            t0 = time.perf_counter()
            algo.step(num_frames=2048)
            algo_t.append(time.perf_counter() - t0)
        algo.finalize()
        skip = min(3, steps - 1)  # optimizer state allocation, first-touch pages
        st = algo.stats()
        out[name] = {"bare_s": sum(bare_t[skip:]) / len(bare_t[skip:]),
                     "mean_s": sum(algo_t[skip:]) / len(algo_t[skip:]),
                     "comm_s_per_step": st.get("comm_seconds", 0.0) / max(steps, 1),
                     "bytes_per_step": st.get("bytes_per_step", 0.0),
                     "sent_fraction": st.get("sent_fraction")}
        del model, opt, algo
    return out


def overhead_bench(grads: list[torch.Tensor], cfg: Config, steps: int) -> dict[str, Any]:
    tc = cfg.train
    train_kw = {"gtc_tau": tc.algo.gtc_tau, "gtc_tau_scale": tc.algo.gtc_tau_scale,
                "block_size": tc.algo.block_size, "block_lr": tc.algo.block_lr,
                "block_momentum": tc.algo.block_momentum, "bmuf_c": tc.algo.bmuf_c,
                "group_size": 2, "ma_samples": tc.algo.ma_samples,
                "minibatch_frames": tc.batches.minibatch_frames}
    algos = ["sgd", "gtc", "bmuf", "htm", "ma"]
    with tempfile.TemporaryDirectory(prefix="amflow-bench-gtc-") as tmp:
        path = os.path.join(tmp, "grads.pt")
        torch.save(grads, path)
        res = spawn_local(_overhead_worker, 2, path, algos, steps, train_kw, timeout=3600)
    table = {}
    bares = []
    for a in algos:
        mean = max(r[a]["mean_s"] for r in res)  # the slower rank sets the pace
        bare = max(r[a]["bare_s"] for r in res)
        bares.append(bare)
        table[a] = {"s_per_minibatch": round(mean, 4), "bare_s_per_minibatch": round(bare, 4),
                    "relative_to_bare_step": round(mean / bare, 3),
                    "overhead": round(mean / bare - 1, 3),
                    # the algorithm's own work (codec + communication) per bare step
                    "comm_relative_to_bare_step": round(res[0][a]["comm_s_per_step"] / bare, 3),
                    "comm_s_per_minibatch": round(res[0][a]["comm_s_per_step"], 4),
                    "bytes_per_minibatch": round(res[0][a]["bytes_per_step"]),
                    "sent_fraction": res[0][a]["sent_fraction"]}
    return {"workers": 2, "steps": steps, "bare_step_s": round(statistics.median(bares), 4),
            "note": "htm with group_size 2 over 2 workers is one GTC group", "algorithms": table}


def run(ctx: Any, args: Any) -> dict[str, Any]:
    cfg = ctx.cfg
    torch.set_num_threads(1)
    model = paper_model(0)
    sizes = [p.numel() for p in model.parameters() if p.requires_grad]
    n = sum(sizes)
    t0 = time.perf_counter()
    grads = real_gradients(model, 4)
    grad_s = time.perf_counter() - t0
    del model
    codec = codec_bench(grads, sizes, cfg.bench.gtc_steps, cfg.train.algo.gtc_tau_scale)
    ov_steps = cfg.bench.overhead_steps or cfg.train.algo.block_size + 10
    overheads = overhead_bench(grads, cfg, ov_steps)
    result = {"model": dict(PAPER_MODEL, params=n), "gradient_seconds": round(grad_s, 2),
              "codec": codec, "overheads": overheads,
              "gtc_gb_per_s": codec["gb_per_s"],
              "gtc_compression_vs_fp32": codec["compression_vs_fp32"],
              "gtc_sent_fraction": codec["sent_fraction"]}
    lines = [f"GTC codec on {n / 1e6:.1f} M params, 1 core: {codec['gb_per_s']} GB/s of gradient "
             f"(encode {codec['encode_ms']} ms + decode {codec['decode_ms']} ms), sends "
             f"{codec['sent_fraction'] * 100:.3f} % -> {codec['compression_vs_fp32']}x fewer "
             "bytes than dense fp32",
             f"per-minibatch time relative to the bare Adam step ({overheads['bare_step_s']} s), "
             "2 gloo workers:"]
    for a, r in overheads["algorithms"].items():
        lines.append(f"  {a:5s} x{r['relative_to_bare_step']:.2f} (own work "
                     f"x{r['comm_relative_to_bare_step']:.2f}: {r['comm_s_per_minibatch']} s)"
                     f"  bytes/minibatch {r['bytes_per_minibatch']}")
    print("\n".join(lines))
    return result
