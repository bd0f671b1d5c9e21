"""`amflow serve`: deploy the streaming recognizer (serving/app.py), print the URL, keep
serving until interrupted.

Resolves the model's run (…/runs/<R>/<train dir>/model.pt, or --run-id), its lexicon,
LM and graph cache as `amflow decode` does (decoding.assets.DecoderAssets; a CTC model:
its T o L o G, decoder_setup.ctc_graph), and the scales `amflow decode` tuned for
it (`decode_record`: decode[-<tag>]/result.json when it is of the model's kind, else the
run's decode dir whose result names this model; else decode.acwt[0], or for a CTC model
decode.ctc_lm_weights[0] and decode.blank_penalties[0]; serve.acwt overrides the acwt).
The model card's kind says which: no flag names it. serve.backend=onnxruntime serves the
streaming graph `amflow export` wrote for this model (its export folder follows the model:
amflow.services.export_folder), refused unless its metadata names this model.pt's digest.
"""
from __future__ import annotations

import os
import time
from typing import Any

from core.runs import StepContext, StepError, step_dir_name
from amflow.services import decoder_setup
from core.storage import join
from serving import app
from training.families import get_family
from amflow.services.export_folder import export_dir_name
from amflow.services.train_plan import train_dir_name


def serve_context(ctx: Any, model: str | None) -> tuple[StepContext, str]:
    """A StepContext on the model's run (…/runs/<R>/<train dir>/model.pt), where the
    graph, LM and tuned acwt live; --run-id wins; a context with no run needs --model."""
    if ctx.run_id:
        if model:  # a train step of the run, or a URI, as decode takes --model
            return ctx, decoder_setup.step_or_uri(ctx, model)
        return ctx, ctx.other(train_dir_name(ctx.cfg.decode.tag), "model.pt")
    if not model:
        raise StepError("amflow serve needs --model (or --run-id to serve that run's student)")
    parts = model.replace("\\", "/").split("/")
    run_id = parts[parts.index("runs") + 1] if "runs" in parts[:-2] else "serve"
    return StepContext(ctx.cfg, run_id, "serve"), model


def _same_model(a: str | None, b: str) -> bool:
    if not a:
        return False
    if "://" in a or "://" in b:
        return a == b
    return os.path.abspath(a) == os.path.abspath(b)


def decode_record(ctx: StepContext, model_uri: str, kind: str) -> tuple[dict | None, str]:
    """(the result.json `amflow decode` wrote for this model, its URI), or (None, ""):
    decode[-<decode.tag>]'s when it decoded a model of this kind (a CTC one: with its
    T o L o G, what serving searches), else the run's decode* dir whose result names this
    model (a CTC student decoded with decode.tag=ctc is found without that tag)."""
    st = ctx.storage
    first = ctx.other(step_dir_name("decode", ctx.cfg.decode.tag), "result.json")
    others = [join(d, "result.json") for d in st.subdirs(ctx.run_uri)
              if os.path.basename(d.rstrip("/")).startswith("decode")]
    for uri in [first] + [u for u in others if u != first]:
        if not st.exists(uri):
            continue
        r = st.read_json(uri)
        tlg = not get_family(kind).token_targets or r.get("search") == "tlg"
        if r.get("model_kind", "student") != kind or not tlg:
            continue
        if uri == first or _same_model(r.get("model"), model_uri):
            return r, uri
    return None, ""


def tuned_scales(ctx: StepContext, model_uri: str, kind: str) -> dict[str, Any]:
    """acwt (and a CTC model's blank penalty) from decode_record, else the config's
    first grid point; `from` says which."""
    dc = ctx.cfg.decode
    rec, uri = decode_record(ctx, model_uri, kind)
    if get_family(kind).token_targets:
        if rec is None:
            w = dc.ctc_lm_weights[0]
            return {"acwt": round(1.0 / w, 6), "lm_weight": w,
                    "blank_penalty": dc.blank_penalties[0],
                    "from": "decode.ctc_lm_weights[0], decode.blank_penalties[0]"}
        return {"acwt": float(rec["acwt"]), "lm_weight": float(rec["lm_weight"]),
                "blank_penalty": float(rec["blank_penalty"]), "from": uri}
    return ({"acwt": float(rec["acwt"]), "from": uri} if rec is not None
            else {"acwt": dc.acwt[0], "from": "decode.acwt[0]"})


def load_assets(ctx: StepContext, model_uri: str) -> dict[str, Any]:
    """What every replica needs (serving.app.replica_assets) for the run's decoder; the
    model card's kind picks the hybrid's or the CTC model's."""
    from training.checkpoint import card_from_bytes

    cfg = ctx.cfg
    if not ctx.storage.exists(model_uri):
        raise StepError(f"model {model_uri} not found")
    if cfg.decode.chunking == "full":
        raise StepError("decode.chunking=full decodes each utterance whole: nothing to stream; "
                        "serve a chunking such as 8x4 (or the model's own: empty)")
    data = decoder_setup.chunked(ctx, ctx.storage.read_bytes(model_uri), model_uri)
    model, card = card_from_bytes(data, model_uri)
    if get_family(card.kind).token_targets:
        return _ctc_assets(ctx, model_uri, data, model, card)
    decoder = decoder_setup.load_assets(ctx, model_uri, cfg.data.corpus, read={model_uri: data})
    tuned = tuned_scales(ctx, model_uri, card.kind)
    assets = app.replica_assets(decoder, cfg.serve, cfg.decode, tuned["acwt"], tuned["from"])
    return with_onnx(ctx, assets, model_uri, data)


def _ctc_assets(ctx: StepContext, model_uri: str, data: bytes, model, card) -> dict[str, Any]:
    from decoding.ctc_decode import check_ctc_card

    check_ctc_card(card, model_uri)
    graph_dir, info, _ = decoder_setup.ctc_graph(ctx, card, {})
    assets = app.ctc_replica_assets(data, model_uri, model, graph_dir, info, ctx.cfg.serve,
                                    ctx.cfg.decode, tuned_scales(ctx, model_uri, card.kind))
    return with_onnx(ctx, assets, model_uri, data)


def with_onnx(ctx: StepContext, assets: dict, model_uri: str, data: bytes) -> dict:
    """serve.backend=onnxruntime: the assets with the model's exported streaming graph
    (`onnx`, `onnx_uri`), refused unless it was exported from this model.pt."""
    if ctx.cfg.serve.backend != "onnxruntime":
        return assets
    uri = onnx_uri(ctx, model_uri, data)
    graph = ctx.storage.read_bytes(uri)
    check_exported_from(graph, uri, model_uri, data)
    return {**assets, "onnx_uri": uri, "onnx": graph}


def onnx_uri(ctx: StepContext, model_uri: str, data: bytes) -> str:
    """serve.onnx_model, else the streaming graph `amflow export` wrote for this model
    (its folder follows the model: amflow.services.export_folder)."""
    uri = ctx.cfg.serve.onnx_model or ctx.other(export_dir_name(ctx, model_uri, data),
                                                "model.streaming.onnx")
    if not ctx.storage.exists(uri):
        raise StepError(f"serve.backend=onnxruntime: {uri} not found: run `amflow export "
                        f"--run-id {ctx.run_id} --model {model_uri}` first, or set "
                        "serve.onnx_model to an exported model.streaming.onnx")
    return uri


def check_exported_from(graph: bytes, graph_uri: str, model_uri: str, data: bytes) -> None:
    """Refuse a graph whose metadata does not name this model.pt's digest (another model
    of the same shape would otherwise be served silently)."""
    from core.storage import digest_of
    from serving.onnx_export import exported_from

    want = digest_of(data)
    got, got_uri = exported_from(graph)
    if got == want:
        return
    source = (f"model {got_uri} (digest {got})" if got else
              "a model it does not name (exported before amflow recorded the model's digest)")
    raise StepError(f"{graph_uri} was exported from {source}, not from {model_uri} (digest "
                    f"{want}): export this model (`amflow export --model {model_uri}`) or set "
                    "serve.onnx_model to its model.streaming.onnx")


def run(ctx: Any, args: Any) -> dict:
    """`amflow serve`: deploy, print the URL, keep serving until interrupted."""
    ctx, model = serve_context(ctx, getattr(args, "model", None))
    t0 = time.perf_counter()
    # an unauthenticated public bind fails before the load
    token = app.client_token(ctx.cfg.serve) is not None
    assets = load_assets(ctx, model)
    url = app.start(ctx.cfg, assets)
    print(f"amflow serve: {assets.get('onnx_uri') or assets['model_uri']} on {url} (ws {url.replace('http', 'ws')}ws), "
          f"{assets['kind']}, acwt {assets['acwt']} ({assets['acwt_from']})"
          f"{', blank penalty ' + str(assets['blank_penalty']) if assets['kind'] == 'ctc' else ''}, "
          f"beam {assets['beam']}, "
          f"{ctx.cfg.serve.replicas} replica(s), "
          f"{'client token required' if token else 'no client token'}; "
          f"up in {time.perf_counter() - t0:.1f} s", flush=True)
    summary = {"url": url, "model": assets["model_uri"], "acwt": assets["acwt"],
               "client_token": token}
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
