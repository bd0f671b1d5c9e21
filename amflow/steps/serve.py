"""`amflow serve`: deploy the streaming recognizer (serving/app.py), print the URL, keep
serving until interrupted.

Resolves the model's run (…/runs/<R>/<train dir>/model.pt, or --run-id), its lexicon,
LM and graph cache as `amflow decode` does (decoding.assets.DecoderAssets), and the acwt
by decoding.assets.tuned_acwt's rule (decode[-<tag>]/result.json, else decode.acwt[0];
serve.acwt overrides it).
"""
from __future__ import annotations

import time
from typing import Any

from core.runs import StepContext, StepError, step_dir_name
from amflow.steps import decode as decode_step
from decoding.assets import tuned_acwt
from serving import app
from amflow.steps.train_plan import train_dir_name


def serve_context(ctx_or_cfg, model: str | None) -> tuple[StepContext, str]:
    """A StepContext on the model's run (…/runs/<R>/<train dir>/model.pt), where the
    graph, LM and tuned acwt live; --run-id wins; a bare config needs --model."""
    if isinstance(ctx_or_cfg, StepContext):
        ctx = ctx_or_cfg
        return ctx, model or ctx.other(train_dir_name(ctx.cfg.decode.tag), "model.pt")
    if not model:
        raise StepError("amflow serve needs --model (or --run-id to serve that run's student)")
    parts = model.replace("\\", "/").split("/")
    run_id = parts[parts.index("runs") + 1] if "runs" in parts[:-2] else "serve"
    return StepContext(ctx_or_cfg, run_id, "serve"), model


def load_assets(ctx: StepContext, model_uri: str) -> dict[str, Any]:
    """What every replica needs (serving.app.replica_assets) for the run's decoder."""
    cfg = ctx.cfg
    if not ctx.storage.exists(model_uri):
        raise StepError(f"model {model_uri} not found")
    decoder = decode_step.load_assets(ctx, model_uri, cfg.data.corpus)
    result_uri = ctx.other(step_dir_name("decode", cfg.decode.tag), "result.json")
    acwt, acwt_from = tuned_acwt(ctx.storage, result_uri, cfg.decode.acwt[0])
    assets = app.replica_assets(decoder, cfg.serve, cfg.decode, acwt, acwt_from)
    if cfg.serve.backend == "onnxruntime":
        assets["onnx_uri"] = onnx_uri(ctx)
        assets["onnx"] = ctx.storage.read_bytes(assets["onnx_uri"])
    return assets


def onnx_uri(ctx: StepContext) -> str:
    """serve.onnx_model, else the run's exported streaming graph (amflow export)."""
    uri = ctx.cfg.serve.onnx_model or ctx.other(step_dir_name("export", ctx.cfg.decode.tag),
                                                "model.streaming.onnx")
    if not ctx.storage.exists(uri):
        raise StepError(f"serve.backend=onnxruntime: {uri} not found: run `amflow export "
                        f"--run-id {ctx.run_id}` first, or set serve.onnx_model to an exported "
                        "model.streaming.onnx")
    return uri


def run(ctx_or_cfg, args) -> dict:
    """`amflow serve`: deploy, print the URL, keep serving until interrupted."""
    ctx, model = serve_context(ctx_or_cfg, getattr(args, "model", None))
    t0 = time.perf_counter()
    assets = load_assets(ctx, model)
    url = app.start(ctx.cfg, assets)
    print(f"amflow serve: {assets.get('onnx_uri') or assets['model_uri']} on {url} (ws {url.replace('http', 'ws')}ws), "
          f"acwt {assets['acwt']} ({assets['acwt_from']}), beam {assets['beam']}, "
          f"{ctx.cfg.serve.replicas} replica(s); up in {time.perf_counter() - t0:.1f} s",
          flush=True)
    summary = {"url": url, "model": assets["model_uri"], "acwt": assets["acwt"]}
    if getattr(args, "detach", False):
        return summary
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        # ray is deferred: only an interrupted foreground server needs it here
        from ray import serve

        serve.shutdown()
    return summary
