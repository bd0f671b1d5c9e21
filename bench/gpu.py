"""`python -m bench.gpu [--out result.json] [--quick] [--only scorer,stored,train,gtc,serve]`:
the GPU paths run for real, each beside its CPU version in the same run, without Ray or a
pipeline run (a GPU box with torch, numpy and PyYAML is enough). Random weights and
inputs: these are speeds and numerical agreement, not accuracies.

1. scorer  the targets step's `TeacherScorer` (tasks/targets.py) with the demo's teacher
           (3 x 256 BLSTM) at the demo's 68 classes and the papers' 3,183: frames per
           second on the CPU (fp32, all cores) and on the GPU in fp32 and in fp16 (what
           `targets` runs there), today's path (cuDNN on packed sequences, the top-20
           taken on the GPU) beside the one before (the CPU's per-layer padded path,
           every logit copied to the host), and the GPU's agreement with the CPU
           (argmax, top-20 overlap, largest logit difference).
2. train   one training step (forward, cross-entropy, backward, Adam) of the demo's
           student (2 x 384), the demo's teacher and the papers' student (5 x 768, 3,183
           classes): frames per second on the CPU in fp32, on the GPU in fp32 and under
           bf16 autocast, at the demo's minibatch (512 frames) and a GPU-sized one.
3. gtc     the GTC codec (training/algorithms/gtc.py) on the papers' student's real
           gradients, one CPU core against the GPU in lockstep: GB/s of gradient encoded
           + decoded, and whether the GPU's codes and residual equal the CPU's bit for bit.
4. stored  what `targets` stores under the demo's config (`targets.codec: sqrt31`,
           `targets.mass: 0.99`: two bytes per kept entry) beside the fp16 top-20, on the
           CPU and the GPU: frames per second of scoring + encoding, bytes per frame,
           entries kept, and the share of frames whose stored entries (count, classes,
           levels) are identical to the CPU's, and how far the distributions the student
           rebuilds from them are apart (total variation). The random teacher's output
           layer is sharpened so that it keeps about as many entries as the demo's.
5. serve   the Batch Dispatch forward (serving.recognizer.StreamModel), per batch size:
           the CPU in fp32 on one thread (a CPU replica), the GPU in fp32 / fp16 / bf16.

The sequence criteria (LF-MMI, LF-sMBR) on the GPU: `python -m bench.sequence`, which
picks CUDA itself.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time
from typing import Any, Callable

import numpy as np
import torch

from core.records import decode_topk, encode_topk
from tasks.targets import TeacherScorer, topk
from training.losses import teacher_probs
from training.models import StudentLSTM, TeacherBLSTM, num_parameters

INPUT_DIM = 192  # 64 mel bins stacked 3 (features.stack)
TOPK = 20


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _median_s(device: str, fn: Callable[[], Any], repeat: int) -> float:
    """Median wall seconds of `fn` after one warm-up call (kernels, allocator, caches)."""
    fn()
    times = []
    for _ in range(repeat):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _agreement(ref: torch.Tensor, got: torch.Tensor) -> dict[str, float]:
    """How far `got` logits [N, C] are from the fp32 CPU reference."""
    got = got.float()
    k = min(TOPK, ref.shape[1])
    top_ref = ref.topk(k, dim=1).indices.sort(dim=1).values
    top_got = got.topk(k, dim=1).indices.sort(dim=1).values
    overlap = (top_ref.unsqueeze(2) == top_got.unsqueeze(1)).any(2).float().mean()
    return {"argmax_agreement": round(float((ref.argmax(1) == got.argmax(1)).float().mean()), 5),
            f"top{k}_overlap": round(float(overlap), 5),
            "max_abs_logit_diff": float((ref - got).abs().max())}


# ------------------------------------------------------------------------------- scorer
def _utterances(seed: int, quick: bool) -> list[np.ndarray]:
    """Random features of 16 (quick) or 256 utterances of 100-600 frames."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(100, 600, size=16 if quick else 256)
    return [rng.standard_normal((int(n), INPUT_DIM)).astype(np.float32) for n in lens]


def _teachers(quick: bool):
    """(classes, the demo's 3 x 256 BLSTM with random weights) at 68 and 3,183 classes."""
    for classes in ((68,) if quick else (68, 3183)):
        torch.manual_seed(0)
        yield classes, TeacherBLSTM(INPUT_DIM, 256, 3, classes).eval()


def scorer_section(devices: list[str], quick: bool) -> list[dict[str, Any]]:
    feats = _utterances(0, quick)
    rows = []
    for classes, net in _teachers(quick):
        ref = None
        for device, dtype, today, batch in _scorer_variants(devices):
            row = {"classes": classes, "device": device, "dtype": str(dtype),
                   "path": ("top-k on device" + (", cuDNN packed" if device != "cpu" else "")
                            if today else "per-layer padded, all logits to host"),
                   "batch_frames": batch}
            logits, row["frames_per_s"] = _score(net, feats, device, dtype, today, batch)
            if ref is None:
                ref = logits
            else:
                row.update(_agreement(ref, logits))
            rows.append(row)
    return rows


def _scorer_variants(devices: list[str]) -> list[tuple[str, torch.dtype, bool, int]]:
    """(device, dtype, today's path, batch frames). Today's path: cuDNN on packed
    sequences and the top-k taken on the GPU; before 2026-11-26 the GPU ran the CPU's
    per-layer padded path and copied every logit to the host. Batches:
    `targets.batch_frames` (8000) and, on a GPU, 4x that."""
    out = []
    for device in devices:
        if device == "cpu":
            out.append((device, torch.float32, True, 8000))
            continue
        for dtype in (torch.float32, torch.float16):
            out += [(device, dtype, False, 8000), (device, dtype, True, 8000),
                    (device, dtype, True, 32000)]
    return out


def _score(net: torch.nn.Module, feats: list[np.ndarray], device: str, dtype: torch.dtype,
           today: bool, batch_frames: int) -> tuple[torch.Tensor, int]:
    """(logits of every frame, frames per second) of a TeacherScorer producing what
    `targets` stores (the top-20 per frame)."""
    dim = feats[0].shape[1]
    scorer = TeacherScorer(copy.deepcopy(net), np.zeros(dim, np.float32),
                           np.ones(dim, np.float32), device, dtype, batch_frames)
    scorer.model.packed_on_cuda = today
    if today:
        work = lambda: scorer.score_topk(feats, TOPK)  # noqa: E731
    else:
        work = lambda: [topk(lg, TOPK) for lg in scorer.score(feats)]  # noqa: E731
    s = _median_s(device, work, 1 if device == "cpu" else 3)
    return torch.cat(scorer.score(feats)), round(sum(len(f) for f in feats) / s)


# ------------------------------------------------------------------------------- stored
CODECS = (("fp16", 1.0), ("sqrt31", 0.99))  # (targets.codec, targets.mass): before / demo
SHARPEN = 70.0  # x the random output layer: 10.6 of 68 entries hold 99 % (the demo's ~11)
TOPK_FILL = -1.0e4  # train.topk_fill: what a class outside a frame's entries weighs


def stored_section(devices: list[str], quick: bool) -> list[dict[str, Any]]:
    feats = _utterances(1, quick)
    rows = []
    for classes, net in _teachers(quick):
        with torch.no_grad():
            for p in net.output.parameters():
                p.mul_(SHARPEN)
        for code, mass in CODECS:
            ref = None
            for device, batch in [(d, b) for d in devices
                                  for b in ((8000,) if d == "cpu" else (8000, 32000))]:
                stored, row = _stored(net, feats, device, batch, code, mass, classes)
                row.update({"classes": classes, "codec": code, "mass": mass,
                            "device": device, "batch_frames": batch})
                if ref is None:
                    ref = stored
                else:
                    row.update(_stored_agreement(ref, stored, classes))
                rows.append(row)
    return rows


def _stored(net: torch.nn.Module, feats: list[np.ndarray], device: str, batch: int,
            code: str, mass: float, classes: int) -> tuple[list, dict[str, Any]]:
    """What `targets` stores for `feats` (score_topk + encode_topk, as the actor does):
    each utterance's top-k and encoded row, and the rate, bytes and entries per frame."""
    dim = feats[0].shape[1]
    scorer = TeacherScorer(copy.deepcopy(net), np.zeros(dim, np.float32),
                           np.ones(dim, np.float32), device, torch.float32, batch)
    out: list = []

    def work() -> None:
        out[:] = [(sc, encode_topk(sc.topk_idx, sc.topk_logit, sc.topk_len, code, classes))
                  for sc in scorer.score_topk(feats, TOPK, mass=mass, code=code)]
    s = _median_s(device, work, 1 if device == "cpu" else 3)
    frames = sum(len(f) for f in feats)
    stored = sum(v.nbytes for _, enc in out for v in enc.values() if isinstance(v, np.ndarray))
    kept = sum(sc.topk_idx.size if sc.topk_len is None else int(sc.topk_len.sum())
               for sc, _ in out)
    row = {"frames_per_s": round(frames / s), "bytes_per_frame": round(stored / frames, 2),
           "entries_per_frame": round(kept / frames, 2)}
    return list(out), row


def _stored_agreement(ref: list, got: list, classes: int) -> dict[str, float]:
    """How far `got`'s stored targets are from the CPU's (`ref`), each row read back as the
    student reads it (records.decode_topk): the share of frames stored identically (the
    same classes and values, dropped entries included), and the total variation between
    the distributions the student rebuilds (training.losses.teacher_probs), mean over
    frames and the largest."""
    same = frames = 0
    tv_sum, tv_max = 0.0, 0.0
    for (_, enc0), (_, enc1) in zip(ref, got):
        (i0, v0), (i1, v1) = decode_topk(enc0), decode_topk(enc1)
        same += _frames_alike((i0, v0), (i1, v1))
        frames += len(i0)
        p0, p1 = (teacher_probs(torch.from_numpy(i), torch.from_numpy(v), classes, TOPK_FILL)
                  for i, v in ((i0, v0), (i1, v1)))
        tv = 0.5 * (p0 - p1).abs().sum(-1)
        tv_sum += float(tv.sum())
        tv_max = max(tv_max, float(tv.max())) if len(tv) else tv_max
    return {"frames_stored_identical": round(same / max(frames, 1), 5),
            "target_tv_mean": round(tv_sum / max(frames, 1), 6),
            "target_tv_max": round(tv_max, 6)}


def _frames_alike(a: tuple, b: tuple) -> int:
    """How many frames two decoded rows ([T, k] classes, [T, k] values; a dropped entry
    reads PAD_LOGIT) hold identically: same count, classes and values."""
    (i0, v0), (i1, v1) = a, b
    return int(((i0 == i1).all(1) & (v0 == v1).all(1)).sum())


# -------------------------------------------------------------------------------- train
def _models() -> dict[str, Callable[[], torch.nn.Module]]:
    return {"demo_student_2x384": lambda: StudentLSTM(INPUT_DIM, 384, 2, 68, lookahead=3),
            "demo_teacher_3x256_blstm": lambda: TeacherBLSTM(INPUT_DIM, 256, 3, 68),
            "paper_student_5x768": lambda: StudentLSTM(INPUT_DIM, 768, 5, 3183, lookahead=3)}


def _train_step(model: torch.nn.Module, device: str, frames: int, chunk: int,
                autocast: torch.dtype | None) -> Callable[[], float]:
    classes = model.output.out_features
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(frames // chunk, chunk, INPUT_DIM, generator=gen).to(device)
    y = torch.randint(0, classes, (frames // chunk, chunk), generator=gen).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.split(":")[0], dtype=autocast or torch.float32,
                            enabled=autocast is not None):
            logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, classes),
                                                 y.reshape(-1))
        loss.backward()
        opt.step()
        return float(loss.detach())
    return step


def train_section(devices: list[str], quick: bool) -> list[dict[str, Any]]:
    rows = []
    models = _models()
    names = list(models)[:1] if quick else list(models)
    for name in names:
        for frames in ((512,) if quick else (512, 8192)):
            for device in devices:
                if device == "cpu" and frames > 512:
                    continue  # minutes per step on a CPU at this size
                for autocast in ((None,) if device == "cpu" else (None, torch.bfloat16)):
                    torch.manual_seed(0)
                    model = models[name]().to(device).train()
                    step = _train_step(model, device, frames, 32, autocast)
                    s = _median_s(device, step, 2 if device == "cpu" else 10)
                    rows.append({"model": name, "parameters": num_parameters(model),
                                 "minibatch_frames": frames, "device": device,
                                 "precision": "bf16 autocast" if autocast else "fp32",
                                 "s_per_step": round(s, 5), "frames_per_s": round(frames / s)})
    return rows


# ---------------------------------------------------------------------------------- gtc
def codec_lockstep(grads: list[torch.Tensor], tau: Any, device: str, steps: int
                   ) -> dict[str, Any]:
    """The codec on one CPU core (`ref`) and on `device` (`dev`), step by step on the same
    gradients (random gains per minibatch, as `bench gtc`): timings, and whether both
    sides' codes and residuals stay bitwise equal."""
    from training.algorithms.gtc import decode_add_, encode_, padded_bool

    n = grads[0].numel()
    sides = {k: {"device": d, "residual": torch.zeros(n, device=d),
                 "dense": torch.zeros(n, device=d), "mask": padded_bool(n, torch.device(d)),
                 "scratch": padded_bool(n, torch.device(d)), "s": []}
             for k, d in (("ref", "cpu"), ("dev", device))}
    gen = torch.Generator().manual_seed(1)
    equal, sent = True, []
    for i in range(steps):
        g = grads[i % len(grads)] * float(torch.empty(()).uniform_(0.5, 1.5, generator=gen))
        codes = {}
        for k, side in sides.items():
            d = side["device"]
            gd = g.to(d)
            _sync(d)
            t0 = time.perf_counter()
            codes[k] = encode_(side["residual"], gd, tau, side["mask"], side["scratch"])
            side["dense"].zero_()
            decode_add_(side["dense"], codes[k], tau)
            _sync(d)
            side["s"].append(time.perf_counter() - t0)
        equal &= bool(torch.equal(codes["ref"], codes["dev"].cpu())) and bool(
            torch.equal(sides["ref"]["residual"], sides["dev"]["residual"].cpu()))
        sent.append(codes["ref"].numel() / n)
    warm = steps // 2
    rate = {k: 4 * n / statistics.median(side["s"][warm:]) / 1e9 for k, side in sides.items()}
    return {"parameters": n, "steps": steps, "device": device,
            "sent_fraction": round(statistics.mean(sent[warm:]), 6),
            "cpu_1_core_gb_per_s": round(rate["ref"], 3),
            "device_gb_per_s": round(rate["dev"], 3),
            "device_over_cpu_core": round(rate["dev"] / rate["ref"], 1),
            "codes_and_residual_bitwise_equal": equal}


def gtc_section(devices: list[str], quick: bool) -> dict[str, Any]:
    from core.config import TrainConfig
    from bench.gtc import paper_model, real_gradients
    from training.algorithms.gtc import Thresholds

    gpu = next((d for d in devices if d != "cpu"), None)
    if gpu is None:
        return {"skipped": "no GPU"}
    model = paper_model(0)
    sizes = [p.numel() for p in model.parameters() if p.requires_grad]
    grads = real_gradients(model, 2 if quick else 4)
    scale = TrainConfig().algo.gtc_tau_scale
    tau = Thresholds(sizes, [scale * float(p.abs().mean()) for p in grads[0].split(sizes)])
    torch.set_num_threads(1)  # the CPU side is one core's work, as in `bench gtc`
    return codec_lockstep(grads, tau, gpu, 6 if quick else 40)


# -------------------------------------------------------------------------------- serve
def serve_section(devices: list[str], quick: bool) -> list[dict[str, Any]]:
    from bench.serve_forward import measure
    from serving.recognizer import StreamModel

    torch.manual_seed(0)
    net = StudentLSTM(INPUT_DIM, 384, 2, 68, lookahead=3).eval()
    batches = [1, 8, 32] if quick else [1, 8, 32, 128, 512]
    rows = []
    for device in devices:
        threads = torch.get_num_threads()
        if device == "cpu":
            torch.set_num_threads(1)  # a CPU replica's forward thread
        for dtype in (("fp32",) if device == "cpu" else ("fp32", "fp16", "bf16")):
            sm = StreamModel(copy.deepcopy(net), dtype, device)
            for r in measure(sm, batches, 3, 5 if device == "cpu" else 20):
                rows.append({"device": device, "dtype": dtype, **r})
        torch.set_num_threads(threads)
    return rows


SECTIONS = {"scorer": scorer_section, "stored": stored_section, "train": train_section,
            "gtc": gtc_section, "serve": serve_section}


def _environment() -> dict[str, Any]:
    env = {"torch": torch.__version__, "cpu_threads": torch.get_num_threads(),
           "cuda": torch.cuda.is_available()}
    if env["cuda"]:
        from core.precision import gpu_fp16_pays

        env["gpu"] = torch.cuda.get_device_name(0)
        env["cuda_version"] = torch.version.cuda
        env["compute_capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
        # what `targets.fp16: auto` and `serve.dtype: auto` run on this GPU
        env["auto_precision"] = "fp16" if gpu_fp16_pays(0) else "fp32"
    return env


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="write the JSON here too (after every section)")
    p.add_argument("--quick", action="store_true", help="tiny sizes (tests, a CPU check)")
    p.add_argument("--only", default=",".join(SECTIONS))
    p.add_argument("--devices", default="", help="default: cpu, and cuda when present")
    a = p.parse_args(argv)
    devices = a.devices.split(",") if a.devices else (
        ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
    result: dict[str, Any] = {"environment": _environment(), "devices": devices}
    threads = torch.get_num_threads()
    for name in a.only.split(","):
        t0 = time.perf_counter()
        result[name] = SECTIONS[name](devices, a.quick)
        torch.set_num_threads(threads)
        result.setdefault("section_s", {})[name] = round(time.perf_counter() - t0, 1)
        print(f"== {name} ({result['section_s'][name]} s)\n"
              f"{json.dumps(result[name], indent=1)}", flush=True)
        if a.out:
            os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
            with open(a.out, "w") as f:
                json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
