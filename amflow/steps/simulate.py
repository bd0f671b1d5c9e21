"""`amflow simulate`: project trainer throughput to 16-128 GPUs from measured numbers
(the cost models: training/simulate.py).

Reads   measured bytes per minibatch per algorithm (GTC/HTM sparsity above all) from
        `--measured FILE`, else this run's `bench/trainers.json`, else the algorithm
        stats in this run's `train*/_SUCCESS.json`, else the sparsity `bench gtc` measured
        on the 24 M model (`bench/gtc.json`).
Writes  runs/<R>/simulate/table.md, table.json, _SUCCESS.json
"""
from __future__ import annotations

from typing import Any

from core.runs import StepContext
from training.simulate import simulate


def _from_train_success(ctx: StepContext) -> dict[str, Any]:
    """Algorithm stats from this run's train steps (train, train-<tag>)."""
    out: dict[str, Any] = {"algorithms": {}}
    run = ctx.run_uri
    for uri in ctx.storage.list(run, suffix="_SUCCESS.json", recursive=True):
        step = uri[len(run):].strip("/").split("/")[0]
        if not step.startswith("train"):
            continue
        m = ctx.storage.read_json(uri).get("metrics", {})
        algo = m.get("algorithm")
        if not algo or m.get("workers", 1) <= 1:
            continue
        stats = {k[len("algo_"):]: v for k, v in m.items() if k.startswith("algo_")}
        stats["workers"] = m.get("workers")
        out["algorithms"][algo] = stats
        out.setdefault("params_measured", m.get("parameters"))
        out.setdefault("compute_s_per_minibatch", m.get("compute_s_per_minibatch"))
        out["source"] = uri
    return out


def load_measured(ctx: StepContext, measured: str | None) -> dict[str, Any]:
    if measured:
        data = ctx.storage.read_json(measured)
        data = data.get("measured", data)
        data.setdefault("source", measured)
        return data
    bench = ctx.other("bench", "trainers.json")
    if ctx.storage.exists(bench):
        data = ctx.storage.read_json(bench)["measured"]
        data.setdefault("source", bench)
        return data
    data = _from_train_success(ctx)
    codec = ctx.other("bench", "gtc.json")
    if not data["algorithms"] and ctx.storage.exists(codec):
        # the codec benchmark's sparsity on the 24 M model (real gradients, 2 workers)
        g = ctx.storage.read_json(codec)
        algos = g.get("overheads", {}).get("algorithms", {})
        for name in ("gtc", "htm"):
            st = algos.get(name, {})
            if st.get("sent_fraction") is not None:
                data["algorithms"][name] = {"sent_fraction": st["sent_fraction"],
                                            "workers": g["overheads"].get("workers")}
        data["source"] = codec
    return data


def run(ctx: StepContext, args: Any = None) -> dict[str, Any]:
    measured = load_measured(ctx, getattr(args, "measured", None))
    out = simulate(ctx.cfg, measured)
    ctx.storage.write_text(ctx.path("table.md"), out.markdown)
    ctx.storage.write_json(ctx.path("table.json"), out.result)
    print(out.markdown)
    return ctx.finish(inputs={"measured": out.result["notes"].get("measured_source")},
                      counts={"in": out.cells, "out": out.cells},
                      metrics=out.metrics, extra={"table_md": ctx.path("table.md")})
