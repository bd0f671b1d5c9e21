"""`amflow bench train --run-id R`: training throughput on one core, and the loader's.

Measured side by side in one process, with torch on one thread:
- model: frames/s of full training steps (forward, backward, Adam update) on chunked
  minibatches of `train.minibatch_frames` from the data loader, for the configured (tiny)
  student, the tiny teacher, and the paper-size student (5 x 768 LSTM, 3-frame
  look-ahead, 3,183 classes, ~24 M parameters);
- loader: frames/s of the data loader alone (partition read, decode, frame offset, CMVN,
  chunking and padding in its background thread), drained by an idle consumer.
The ratios loader / model say how far the loader is from being the bottleneck.

Data: the run's `repartition/<train.labeled_split>` partitions when they exist, else a
synthetic run (192-d features, written under `runs/<R>/bench/synthetic`).
"""
from __future__ import annotations

import time
from typing import Any

import torch

from core.config import ModelConfig, StudentConfig, TeacherConfig
from core.runs import StepContext
from core.storage import join
from amflow.services.synthetic_run import make_synthetic_run
from training.data import (BatchLoader, Normalizer, PassSpec, SplitIndex, loader_throughput,
                           partition_uris)
from training.families import get_family
from training.loop import batch_loss
from training.models import build_model, num_parameters

PAPER_CLASSES = 3183


def labeled_data(ctx: StepContext, synthetic_utts: int = 400, synthetic_parts: int = 4
                 ) -> tuple[SplitIndex, Normalizer, int, str]:
    """(index, normalizer, classes, source) of the run's labeled split when features and
    repartition ran, else of a synthetic run of `synthetic_utts` utterances."""
    st = ctx.storage
    uris = partition_uris(st, ctx.other("repartition", ctx.cfg.train.batches.labeled_split))
    cmvn_uri = ctx.other("features", "cmvn.json")
    if uris and st.exists(cmvn_uri):
        index = SplitIndex.load(st, uris, "labels")
        phones = st.read_json(ctx.other("features", "phones.json"))
        return index, Normalizer.from_stats(st.read_json(cmvn_uri), index.feat_dim), \
            len(phones), "run"
    root = ctx.path("synthetic")
    info = make_synthetic_run(st, root, num_classes=48, base_dim=ctx.cfg.features.num_mel_bins,
                              dtype=ctx.cfg.features.storage_dtype,
                              splits={"labeled": {"utts": synthetic_utts, "parts": synthetic_parts,
                                                  "rows": (60, 300)}})
    index = SplitIndex.load(st, info["splits"]["labeled"], "labels")
    norm = Normalizer.from_stats(st.read_json(join(root, "features", "cmvn.json")),
                                 index.feat_dim)
    return index, norm, len(info["phones"]), "synthetic"


def _model_fps(ctx: StepContext, index: SplitIndex, norm: Normalizer, kind: str,
               num_classes: int, model_cfg: ModelConfig, budget_s: float,
               min_steps: int = 2) -> dict[str, Any]:
    tc = ctx.cfg.train
    torch.manual_seed(0)
    model = build_model(kind, index.feat_dim, num_classes, model_cfg)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    right = get_family(kind).chunk_right_context(model, tc.batches)
    spec = PassSpec(mode="chunk", chunk_frames=tc.batches.chunk_frames,
                    left_context=tc.batches.chunk_left_context, right_context=right,
                    minibatch_frames=tc.batches.minibatch_frames, stack=ctx.cfg.features.stack)
    frames = steps = 0
    elapsed = 0.0
    warm = True
    while steps < min_steps or elapsed < budget_s:
        for batch in BatchLoader(ctx.storage, index, spec, norm, prefetch=2):
            t0 = time.perf_counter()
            opt.zero_grad()
            out = batch_loss(model, batch, tc)
            out.loss.backward()
            opt.step()
            dt = time.perf_counter() - t0
            if warm:  # the first step pays for allocations
                warm = False
                continue
            frames += out.frames
            steps += 1
            elapsed += dt
            if steps >= min_steps and elapsed >= budget_s:
                break
    return {"kind": kind, "parameters": num_parameters(model), "num_classes": num_classes,
            "steps": steps, "frames": frames, "seconds": round(elapsed, 3),
            "frames_per_s": round(frames / elapsed, 1),
            "s_per_minibatch": round(elapsed / steps, 4)}


def run(ctx: StepContext, args: Any) -> dict[str, Any]:
    threads_before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        index, norm, num_classes, source = labeled_data(ctx)
        mc, batches = ctx.cfg.model, ctx.cfg.train.batches
        tiny_classes = mc.num_classes or num_classes
        paper = ModelConfig(student=StudentConfig(5, 768, 3), teacher=TeacherConfig(5, 768),
                            num_classes=PAPER_CLASSES)
        loader = loader_throughput(ctx.storage, index,
                                   PassSpec(mode="chunk", chunk_frames=batches.chunk_frames,
                                            left_context=batches.chunk_left_context,
                                            right_context=3,
                                            minibatch_frames=batches.minibatch_frames),
                                   norm)
        models = {
            "tiny_student": _model_fps(ctx, index, norm, "student", tiny_classes, mc, 5.0),
            "tiny_teacher": _model_fps(ctx, index, norm, "teacher", tiny_classes, mc, 5.0),
            "paper_student": _model_fps(ctx, index, norm, "student", PAPER_CLASSES, paper, 20.0),
        }
    finally:
        torch.set_num_threads(threads_before)
    ratios = {f"loader_over_{k}": round(loader["frames_per_s"] / v["frames_per_s"], 1)
              for k, v in models.items()}
    result = {"data": source, "utterances": len(index), "frames": index.total_frames,
              "minibatch_frames": batches.minibatch_frames,
              "chunk_frames": batches.chunk_frames, "threads": 1,
              "loader": {k: round(v, 3) for k, v in loader.items()}, **models, **ratios,
              "tiny_over_paper_student": round(models["tiny_student"]["frames_per_s"]
                                               / models["paper_student"]["frames_per_s"], 1)}
    lines = [f"{'what':<16} {'params':>11} {'frames/s':>11} {'loader / model':>15}"]
    for k, v in models.items():
        lines.append(f"{k:<16} {v['parameters']:>11,} {v['frames_per_s']:>11,.0f} "
                     f"{ratios[f'loader_over_{k}']:>14.1f}x")
    lines.append(f"{'loader alone':<16} {'':>11} {loader['frames_per_s']:>11,.0f}")
    print("\n".join(lines), flush=True)
    return result
