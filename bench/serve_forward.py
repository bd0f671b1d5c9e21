"""`python -m bench.serve_forward [--model model.pt | --ctc] [--device cuda] [--dtype fp16]
[--onnx [model.streaming.onnx ...]]`: the Batch Dispatch forward alone (serving.recognizer.
StreamModel, or serving.ctc_stream.CtcStreamModel for a CTC student; no Ray, no search),
per batch size: ms per forward of `--rows` new rows per stream, and how many real-time
streams one forward loop could carry (33 rows/s each). Runs where Ray is not installed (a
GPU box); without --model, a random student of the demo's size (2 x 384, 68 classes;
--ctc: a CTC student, 3 x 256 GRU, 30 tokens). --onnx: also onnxruntime on the same
model's streaming graph (serve.backend=onnxruntime; the graphs given, e.g. amflow export's
fp32 and int8 ones, else exported here), each size measured on every backend in turn, and
the ratio of torch's time to each graph's.
"""
from __future__ import annotations

import argparse
import json
import time
from types import SimpleNamespace

import numpy as np

ROWS_PER_S = 100 / 3  # LFR rows per second of audio (10 ms frames, subsample 3)


def measure(model, batches, rows: int, repeat: int) -> list[dict]:
    rng = np.random.default_rng(0)
    out = []
    for b in batches:
        x = [rng.standard_normal((rows, model.input_dim)).astype(np.float32) for _ in range(b)]
        st = [model.zero_state() for _ in range(b)]
        for _ in range(3):  # warm-up (kernels, caches), into mid-utterance state (a CTC
            _, st = model.forward(x, st)  # step's first calls drop the pre-utterance frames)
        t0 = time.perf_counter()
        for _ in range(repeat):
            model.forward(x, st)
        ms = 1000 * (time.perf_counter() - t0) / repeat
        out.append({"batch": b, "ms_per_forward": round(ms, 3),
                    "ms_per_stream_row": round(ms / (b * rows), 4),
                    # a forward every rows/33 s keeps up with b streams while it takes less
                    "max_streams_if_alone": int(b * (rows / ROWS_PER_S) * 1000 / ms)})
    return out


def main(argv=None) -> None:
    import torch

    from training.models import StudentLSTM

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="a student model.pt (default: random 2 x 384)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="auto", choices=["auto", "fp32", "fp16", "bf16"])
    p.add_argument("--batches", default="1,2,4,8,16,32,64,128")
    p.add_argument("--rows", type=int, default=3, help="new rows per stream per forward")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--ctc", action="store_true", help="without --model: a random CTC "
                   "student (3 x 256 GRU, 30 tokens, lookahead 3) instead of the hybrid's")
    p.add_argument("--onnx", nargs="*", help="streaming graphs to compare (none listed: "
                                             "the model exported here)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    if a.model:
        from training.checkpoint import model_from_bytes

        with open(a.model, "rb") as f:
            net, _ = model_from_bytes(f.read())
    elif a.ctc:
        from training.ctc.model import CtcModel

        net = CtcModel(192, 30, 3, channels=(16, 16), hidden=256, layers=3, lookahead=3).eval()
    else:
        net = StudentLSTM(192, 384, 2, 68, lookahead=3).eval()
    model = stream_model(net, a.dtype, a.device)
    batches = [int(b) for b in a.batches.split(",")]
    rows = measure(model, batches, a.rows, a.repeat)
    out = {"device": a.device, "dtype": str(model.dtype), "rows": rows}
    if a.onnx is not None:
        out["onnxruntime"] = onnx_rows(net, a.onnx, batches, a.rows, a.repeat, a.threads, rows)
    print(json.dumps(out, indent=1))


def stream_model(net, dtype: str, device: str):
    """The recognizer's torch streaming step of the model's family."""
    from serving.recognizer import torch_dtype
    from training.families import family_of

    return family_of(net).stream_model(net, torch_dtype(dtype, device), device)


def onnx_rows(net, paths: list[str], batches, rows: int, repeat: int, threads: int,
              torch_rows: list[dict]) -> dict:
    from serving.onnx_runtime import stream_model as ort_stream_model

    graphs = {p: open(p, "rb").read() for p in paths} or {"exported here": _export(net)}
    out = {}
    for name, blob in graphs.items():
        res = measure(ort_stream_model(blob, threads), batches, rows, repeat)
        for r, t in zip(res, torch_rows):
            r["torch_over_onnx"] = round(t["ms_per_forward"] / r["ms_per_forward"], 2)
        out[name] = res
    return out


def _export(net) -> bytes:
    """The model's streaming graph, as its family exports it."""
    from training.families import family_of

    return family_of(net).export_graphs(net, SimpleNamespace(features={}))["model.streaming.onnx"]
