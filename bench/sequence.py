"""`amflow bench sequence --run-id R` (or `python -m bench.sequence`, no Ray): the cost of
the LF-MMI criterion against cross-entropy, and the size of its denominator graph.

1. Graph. The phone n-gram (training/sequence.py) is estimated from the labeled split's
   frame labels, collapsed into phone sequences, for orders 2, 3 and 4 (pruning
   `train.den_min_count`): states, arcs, whether it runs as a transition-matrix product
   (state-labelled: dense on a GPU, CSR on a CPU when sparse),
   and the estimation time.
2. Time per minibatch, one run, side by side. Copies of the configured student
   (configs/local.yaml: 2 x 384 LSTM, 3 frames of look-ahead) with the same initial
   weights each take a full training step (forward, loss, backward, Adam) on the same
   chunked minibatch of `train.minibatch_frames` frames: one with CE, one with LF-MMI,
   one with LF-sMBR (`train.*` knobs: chunk graph, leaky HMM, CE interpolation, output
   L2). The order rotates every minibatch so all see the same machine load. Reported:
   seconds per minibatch and the ratio to CE. Beside it, each criterion alone (loss and
   its backward on the same detached logits), for the configured order and the trigram.

Data: the run's `repartition/<train.labeled_split>` when it exists, else a synthetic
run (48 phones, 192-d features, written under `runs/<R>/bench/synthetic`). Runs on the
GPU when one is present (torch on one thread on a CPU).
Config: bench.seq_steps (timed minibatches per criterion, default 20).
"""
from __future__ import annotations

import copy
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np
import torch

from core.config import load_config
from core.runs import StepContext
from bench.train import labeled_data
from training.data import BatchLoader, Normalizer, PassSpec, SplitIndex
from training.losses import ce_loss
from training.models import build_model, num_parameters
from training.sequence import (SequenceCriterion, denominator_graph, estimate_phone_ngram,
                               split_label_sequences)


def _graph_sizes(seqs: list[np.ndarray], num_classes: int, min_count: int) -> list[dict]:
    rows = []
    for order in (2, 3, 4):
        t0 = time.perf_counter()
        lm = estimate_phone_ngram(seqs, num_classes, order, min_count)
        g = denominator_graph(lm)
        rows.append({"order": order, "states": g.num_states, "arcs": g.num_arcs,
                     "dense": g.dense_form() is not None,
                     "estimate_s": round(time.perf_counter() - t0, 3)})
    return rows


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _timed(device: torch.device, fn) -> float:
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def _steps(ctx: StepContext, index: SplitIndex, norm: Normalizer, num_classes: int,
           crits: dict[str, SequenceCriterion], device: torch.device,
           steps: int) -> dict[str, Any]:
    """Full training steps, CE and each sequence criterion in turn (the order rotates
    every minibatch) on the same minibatches, each on its own copy of one model."""
    tc, mc = ctx.cfg.train, ctx.cfg.model
    torch.manual_seed(0)
    base = build_model("student", index.feat_dim, num_classes, mc).to(device)
    losses = {"ce": lambda logits, b: ce_loss(logits, b.labels)}
    for name, crit in crits.items():
        losses[name] = lambda logits, b, crit=crit: crit(logits, b.labels, chunked=True)
    models = {k: copy.deepcopy(base).to(device) for k in losses}  # .to: cuDNN flat weights
    opts = {k: torch.optim.Adam(m.parameters(), lr=1e-4) for k, m in models.items()}
    spec = PassSpec(mode="chunk", chunk_frames=tc.batches.chunk_frames,
                    left_context=tc.batches.chunk_left_context, right_context=mc.student.lookahead,
                    minibatch_frames=tc.batches.minibatch_frames, stack=ctx.cfg.features.stack)
    names = list(losses)
    times: dict[str, list[float]] = {k: [] for k in names}
    alone: dict[str, list[float]] = {k: [] for k in names}
    frames = seen = 0
    while seen < steps + 1:
        for batch in BatchLoader(ctx.storage, index, spec, norm, prefetch=2):
            b = batch.to(device)
            order = names[seen % len(names):] + names[:seen % len(names)]
            for k in order:
                def step(k=k):
                    opts[k].zero_grad()
                    out = losses[k](models[k](b.x), b)
                    out.loss.backward()
                    opts[k].step()
                dt = _timed(device, step)
                if seen:  # the first minibatch pays for allocations
                    times[k].append(dt)
            with torch.no_grad():
                logits = base(b.x)
            for k in order:
                leaf = logits.clone().requires_grad_()
                dt = _timed(device, lambda k=k, leaf=leaf: losses[k](leaf, b).loss.backward())
                if seen:
                    alone[k].append(dt)
            frames += batch.frames if seen else 0
            seen += 1
            if seen >= steps + 1:
                break
    med = {k: statistics.median(v) for k, v in times.items()}
    med_alone = {k: statistics.median(v) for k, v in alone.items()}
    return {"parameters": num_parameters(base), "steps": len(times["ce"]),
            "frames_per_minibatch": round(frames / max(len(times["ce"]), 1), 1),
            "s_per_minibatch": {k: round(v, 4) for k, v in med.items()},
            "over_ce": {k: round(med[k] / med["ce"], 2) for k in crits},
            "criterion_alone_s": {k: round(v, 5) for k, v in med_alone.items()},
            "criterion_alone_over_ce": {k: round(med_alone[k] / med_alone["ce"], 1)
                                        for k in crits}}


def run(ctx: StepContext, args: Any = None) -> dict[str, Any]:
    tc = ctx.cfg.train
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    threads_before = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)
    steps = ctx.cfg.bench.seq_steps
    try:
        index, norm, num_classes, source = labeled_data(ctx, 200, 2)
        num_classes = ctx.cfg.model.num_classes or num_classes
        seqs = split_label_sequences(ctx.storage, index.uris, ctx.cfg.features.stack)
        graphs = _graph_sizes(seqs, num_classes, tc.sequence.den_min_count)
        sc = tc.sequence
        crits = {k: SequenceCriterion.from_labels(seqs, num_classes,
                                                  dataclasses.replace(sc, criterion=k))
                 for k in ("mmi", "smbr")}
        crits_size = crits["mmi"].graph_size()
        timing = {"configured": _steps(ctx, index, norm, num_classes, crits, device, steps)}
        tri = dataclasses.replace(sc, den_ngram_order=3)
        crits = {f"{k}_trigram": SequenceCriterion.from_labels(
            seqs, num_classes, dataclasses.replace(tri, criterion=k)) for k in ("mmi", "smbr")}
        timing["trigram"] = _steps(ctx, index, norm, num_classes, crits, device,
                                   max(steps // 2, 2))
    finally:
        torch.set_num_threads(threads_before)
    result = {"data": source, "device": str(device), "utterances": len(index),
              "frames": index.total_frames, "num_classes": num_classes,
              "minibatch_frames": tc.batches.minibatch_frames,
              "chunk_frames": tc.batches.chunk_frames,
              "den_ngram_order": tc.sequence.den_ngram_order,
              "den_min_count": tc.sequence.den_min_count,
              "numerator": tc.sequence.sequence_numerator, "graphs": graphs, "timing": timing,
              # the headline numbers, as scalars for the step summary
              "den_states": crits_size["states"], "den_arcs": crits_size["arcs"],
              **{f"{k}_over_ce": v for k, v in timing["configured"]["over_ce"].items()}}
    _print(result)
    return result


def _print(r: dict[str, Any]) -> None:
    lines = [f"denominator graphs ({r['num_classes']} classes, {r['utterances']} utterances, "
             f"pruning histories seen < {r['den_min_count']} times):",
             f"  {'order':>5} {'states':>8} {'arcs':>9} {'dense':>6} {'estimate s':>11}"]
    for g in r["graphs"]:
        lines.append(f"  {g['order']:>5} {g['states']:>8,} {g['arcs']:>9,} "
                     f"{str(g['dense']):>6} {g['estimate_s']:>11.3f}")
    for part, t in r["timing"].items():
        order = r["den_ngram_order"] if part == "configured" else 3
        lines.append(f"time per minibatch, phone {order}-gram denominator, on {r['device']} "
                     f"({t['frames_per_minibatch']:.0f} scored frames, {t['parameters']:,}-"
                     f"parameter student, median of {t['steps']}):")
        lines.append(f"  {'criterion':<14} {'step s':>8} {'/ CE':>6} {'loss+backward ms':>17} "
                     f"{'/ CE':>7}")
        for k, v in t["s_per_minibatch"].items():
            ratio = t["over_ce"].get(k, 1.0)
            alone = t["criterion_alone_s"][k] * 1e3
            alone_ratio = t["criterion_alone_over_ce"].get(k, 1.0)
            lines.append(f"  {k:<14} {v:>8.4f} {ratio:>5.2f}x {alone:>17.1f} "
                         f"{alone_ratio:>6.1f}x")
    print("\n".join(lines), flush=True)


def main() -> None:
    """`python -m bench.sequence [key=value ...]`: the same, without Ray or a run of
    the pipeline (synthetic data in a temporary directory unless storage.root says)."""
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [f"storage.root={tmp}"] + sys.argv[1:]
        cfg = load_config("configs/local.yaml" if os.path.exists("configs/local.yaml")
                          else None, overrides)
        result = run(StepContext(cfg, "bench-sequence", "bench"))
        print(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
