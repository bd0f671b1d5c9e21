"""`amflow bench targets --run-id R`: the actor pool against a naive loop, side by side.

Both score the same feature shards of run R with the same teacher on the same cores:
- pool: the `targets` step itself (length-sorted batches, `targets.actors` actors with
  `targets.threads_per_actor` threads each, bf16 on CPUs with native bf16), written to a
  scratch step dir; when it ran in bf16, again in fp32 so the ratio can be read both ways;
- naive: one process with as many torch threads as the pool has in total, one
  utterance at a time, no batching.
It prints frames/s of both and their ratio, and the bytes per audio hour of top-k
targets against full fp16 posteriors (measured on this teacher, and raw at the paper's
3,183 classes), and what pruning each frame to a share of its mass (`targets.mass`) and
coding each entry (`targets.codec`) store, with the KL the student pays for it. Both sides
are zstd Parquet at `targets.zstd_level`.
"""
from __future__ import annotations

import io
import time
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from core.records import (decode_feats, encode_topk, iter_rows, load_cmvn, read_table,
                          target_schema, to_table)
from core.runs import StepContext, StepError
from amflow.steps import targets as targets_step
from tasks import targets as T
from training.checkpoint import load_model_card

FRAME_S = 0.03  # one low-frame-rate row
MASSES = (1.0, 0.99, 0.98, 0.95)  # targets.mass values measured beside the configured one
CODECS = ("fp16", "sqrt31", "sqrt15")  # targets.codec values measured beside the configured one
STORAGE_SAMPLE = 200  # utterances the storage measure scores, spread over all shards


def _naive_frames_per_s(model, feats, mean, inv_std, threads: int, budget_s: float) -> float:
    torch.set_num_threads(threads)
    model = model.eval()
    m, s = torch.from_numpy(mean), torch.from_numpy(inv_std)
    frames, t0 = 0, time.perf_counter()
    with torch.inference_mode():
        for x in feats:
            model(((torch.from_numpy(x) - m) * s)[None])
            frames += len(x)
            if time.perf_counter() - t0 > budget_s:
                break
    return frames / (time.perf_counter() - t0)


def _parquet_bytes(table: pa.Table, level: int) -> int:
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", compression_level=level)
    return len(buf.getvalue())


def run(ctx: StepContext, args: Any) -> dict[str, Any]:
    cfg = ctx.cfg
    if not ctx.storage.exists(ctx.other("features", "_SUCCESS.json")):
        raise StepError(f"bench targets needs run '{ctx.run_id}' with features (and a teacher "
                        "at targets.teacher or runs/<id>/train/model.pt)")
    pool_ctx = StepContext(cfg, ctx.run_id, "bench/targets-pool", force=True)
    pool = targets_step.run(pool_ctx)
    pool_fps = pool["metrics"]["frames_per_s"]
    precision = pool["metrics"]["actors"][0].get("precision", "float32")
    pool32_fps = pool_fps
    if precision != "float32":
        # the same pool in fp32, to separate batching from bf16 in the ratio
        cfg32 = replace(cfg, targets=replace(cfg.targets, cpu_precision="fp32"))
        pool32 = targets_step.run(StepContext(cfg32, ctx.run_id, "bench/targets-pool-fp32",
                                              force=True))
        pool32_fps = pool32["metrics"]["frames_per_s"]

    teacher = T.teacher_uri(cfg.targets, ctx.other("train"))  # else this run's train/model.pt
    model, card = load_model_card(ctx.storage, teacher)
    cmvn = card.cmvn or ctx.storage.read_json(ctx.other("features", "cmvn.json"))
    mean, inv_std = load_cmvn(cmvn)
    feats = []
    for shard in T.feature_shards(ctx.storage, ctx.other("features")):
        rows = read_table(ctx.storage, ctx.other("features", "shards", f"{shard}.parquet"))
        feats += [decode_feats(r) for r in iter_rows(rows)]
    threads = cfg.targets.actors * cfg.targets.threads_per_actor
    naive_fps = _naive_frames_per_s(model, feats, mean, inv_std, threads, budget_s=20.0)
    # Intra-op threads thrash on small LSTMs when cores are shared; the kinder baseline is
    # one thread, scaled perfectly to the pool's cores.
    naive_1t = _naive_frames_per_s(model, feats, mean, inv_std, 1, budget_s=20.0)

    # Storage: top-k as written vs full fp16 posteriors of the same frames.
    # every split the step scores, in proportion: the first shards alone are the labeled
    # split, which the teacher trained on and is surest of
    sample = feats[::max(1, len(feats) // STORAGE_SAMPLE)][:STORAGE_SAMPLE]
    with torch.inference_mode():
        scorer = T.TeacherScorer(model, mean, inv_std)
        logits = torch.cat(scorer.score(sample))
    n = logits.shape[0]
    c = logits.shape[1]
    tc = cfg.targets
    full = torch.softmax(logits, -1).to(torch.float16).numpy()
    full_b = _parquet_bytes(pa.table({"posterior": [full.tobytes()]}), tc.zstd_level) / n
    # the configured layout, and targets.mass / codec values beside it, as the step stores them
    sweep = {(m, code): _stored(logits, tc.k, m, code, tc.zstd_level)
             for code in dict.fromkeys((tc.codec, *CODECS))
             for m in sorted({tc.mass, *MASSES}, reverse=True)}
    topk_b = sweep[tc.mass, tc.codec]["bytes_per_frame"]
    per_hour = 3600.0 / FRAME_S
    paper_c = 3183
    result = {
        "teacher": teacher,
        "frames": pool["metrics"]["frames"],
        "pool_frames_per_s": pool_fps,
        "pool_precision": precision,
        "pool_fp32_frames_per_s": pool32_fps,
        "speedup_pool_fp32_over_naive": round(pool32_fps / naive_fps, 2) if naive_fps else None,
        "naive_frames_per_s": round(naive_fps, 1),
        "speedup_pool_over_naive": round(pool_fps / naive_fps, 2) if naive_fps else None,
        "naive_1thread_frames_per_s": round(naive_1t, 1),
        "speedup_pool_over_naive_1thread_x_cores": round(pool_fps / (naive_1t * threads), 2)
        if naive_1t else None,
        "cores": threads,
        "num_classes": c, "k": cfg.targets.k, "mass": tc.mass, "codec": tc.codec,
        "zstd_level": tc.zstd_level,
        "entries_per_frame": sweep[tc.mass, tc.codec]["entries_per_frame"],
        "mass_sweep": [{"mass": m, "codec": code, **v,
                        "full_over_stored": round(full_b / v["bytes_per_frame"], 1)}
                       for (m, code), v in sweep.items()],
        "topk_bytes_per_audio_hour": round(topk_b * per_hour),
        "full_fp16_bytes_per_audio_hour": round(full_b * per_hour),
        "full_over_topk_measured": round(full_b / topk_b, 1),
        "paper_classes": paper_c,
        "full_over_topk_raw_at_paper_classes": round(
            T.full_posterior_bytes_per_frame(paper_c) / T.topk_bytes_per_frame(cfg.targets.k), 1),
        "fidelity": pool["metrics"]["fidelity"],
    }
    print(f"targets: scoring with {teacher} (targets.teacher)")
    print(f"targets: pool ({precision}) {pool_fps:.0f} frames/s vs naive fp32 loop "
          f"{naive_fps:.0f} frames/s on {threads} cores -> {result['speedup_pool_over_naive']}x "
          f"(pool in fp32: {pool32_fps:.0f} frames/s -> "
          f"{result['speedup_pool_fp32_over_naive']}x); vs a 1-thread naive loop "
          f"({naive_1t:.0f} frames/s) scaled to {threads} cores -> "
          f"{result['speedup_pool_over_naive_1thread_x_cores']}x")
    print(f"targets: top-k {topk_b * per_hour / 1e6:.2f} MB/h ({result['entries_per_frame']} "
          f"entries per frame, k={tc.k}, mass {tc.mass}) vs full fp16 posteriors "
          f"{full_b * per_hour / 1e6:.2f} MB/h "
          f"({c} classes, measured) -> {result['full_over_topk_measured']}x; raw at {paper_c} "
          f"classes: {result['full_over_topk_raw_at_paper_classes']}x")
    print(f"targets.mass  codec   entries/frame  mass kept  KL(stored||full)  bytes/frame  "
          f"full fp16 / stored  (k={tc.k}, zstd level {tc.zstd_level}, full fp16 "
          f"{full_b:.1f} B/frame)")
    for row in result["mass_sweep"]:
        print(f"  {row['mass']:<11} {row['codec']:<7} {row['entries_per_frame']:>13} "
              f"{row['mass_kept']:>10} {row['kl_nats']:>16} {row['bytes_per_frame']:>12} "
              f"{row['full_over_stored']:>17}x")
    return result


def _stored(logits: torch.Tensor, k: int, mass: float, code: str, level: int
            ) -> dict[str, float]:
    """Bytes per frame of the top-k targets as the step stores them at `mass` and `code`
    (zstd Parquet at `level`), with the entries, the share of the teacher's probability
    they keep and KL(stored || teacher) in nats per frame."""
    idx, val, lens = T.top_entries(logits, k, code, mass)
    row = encode_topk(idx, val, lens, code, logits.shape[-1])
    table = to_table([row], target_schema(row["topk_code"])).select(
        ["topk_idx", "topk_logit", "topk_len"])
    fid = T.fidelity(logits, ks=(idx.shape[1],), mass=mass, code=code)[idx.shape[1]]
    n = logits.shape[0]
    return {"entries_per_frame": round(fid["entries_sum"] / n, 2),
            "mass_kept": round(fid["mass_sum"] / n, 4),
            "kl_nats": round(fid["kl_sum"] / n, 4),
            "bytes_per_frame": round(_parquet_bytes(table, level) / n, 1)}
