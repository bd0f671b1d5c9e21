"""`amflow targets`: the teacher labels the run's features; only the top-k logits are kept.

Pure core (tensors in, tensors out): length-sorted batching, chunked scoring of very
long utterances, top-k selection, rebuilding a distribution from top-k logits, and the
fidelity measures (probability mass kept, KL(full || rebuilt)).

Shell: a pool of Ray actors, each holding the teacher once. On GPUs an actor takes
`num_gpus=1`, runs the model in fp16 where that pays (`targets.fp16`) and takes the top-k
on the GPU, so only k values per frame cross to the host (bench/GPU.md); on CPUs each actor has its own
thread count.
With `targets.mass` < 1 a frame keeps only the fewest of its top-k whose probability
reaches that share (kept_for_mass), stored packed (core/records.py, `topk_len`);
`targets.codec` sqrt<L> stores each entry in two bytes (records.encode_topk).
Actors take whole feature shards (the unit of parallelism), write
`targets/shards/<shard>.parquet` aligned row for row with the feature shard, then the
shard's done-marker, so a re-run skips finished shards.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch

from core import precision
from core.config import StorageConfig, TargetsConfig
from core.model_card import ModelCard
from core.records import (decode_feats, dequantize_sqrt, encode_topk, iter_rows, load_cmvn,
                          quantize_ranked, read_table, target_schema, to_table)
from core.outcomes import Reject, StepError, rejects_table, shard_marker_uri
from core.storage import Storage, join
from core.target_codes import FP16_CODE, sqrt_levels
from core.soft_targets import teacher_log_probs

from tasks.target_plan import (OPERATIONAL_KEYS, feature_shards, scoring_plan,  # noqa: F401
                               teacher_uri)

log = logging.getLogger(__name__)

FIDELITY_KS = (1, 5, 10, 20, 50)


# ---------------------------------------------------------------- pure core
def length_batches(lengths: Sequence[int], batch_frames: int) -> list[list[int]]:
    """Indices grouped so that each batch's padded size (count x longest) fits the budget.

    Sorting by length first keeps utterances of similar length together, which is what
    cuts the padding; a single utterance longer than the budget forms its own batch.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        longest = max(lengths[i], max((lengths[j] for j in current), default=0))
        if current and longest * (len(current) + 1) > batch_frames:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def chunk_spans(num_frames: int, max_frames: int, overlap: int) -> list[tuple[int, int, int, int]]:
    """Split a long utterance for a bidirectional model.

    Returns (start, end, keep_start, keep_end): score frames [start, end) and keep the
    outputs for [keep_start, keep_end). Neighbouring chunks overlap by `overlap` frames on
    each side so every kept frame sees at least `overlap` frames of context both ways.
    """
    if num_frames <= max_frames:
        return [(0, num_frames, 0, num_frames)]
    step = max_frames - 2 * overlap
    if step <= 0:
        raise ValueError("targets.max_frames must exceed twice the chunk overlap")
    spans = []
    keep_start = 0
    while keep_start < num_frames:
        keep_end = min(keep_start + step, num_frames)
        start = max(0, keep_start - overlap)
        end = min(num_frames, keep_end + overlap)
        spans.append((start, end, keep_start, keep_end))
        keep_start = keep_end
    return spans


def top_entries(logits: torch.Tensor, k: int, code: str = FP16_CODE, mass: float = 1.0
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """[..., C] logits -> the k largest per frame, on the host (taken where the logits
    are): int16 indices, values (fp16 logits for the fp16 code, float32 log-probabilities
    for the sqrt<L> codes, which store probabilities) and, with `mass` < 1, the uint8
    count each frame keeps (kept_for_mass), else None. One top-k serves all three."""
    k = min(k, logits.shape[-1])
    logits = logits.float()
    top, idx = torch.topk(logits, k, dim=-1)
    lens = None
    if code != FP16_CODE or mass < 1.0:
        top_logp = top - torch.logsumexp(logits, -1, keepdim=True)
        if mass < 1.0:
            lens = kept_for_mass(top_logp, mass).to(torch.uint8).cpu().numpy()
    vals = top.to(torch.float16) if code == FP16_CODE else top_logp
    return idx.to(torch.int16).cpu().numpy(), vals.cpu().numpy(), lens


def topk(logits: torch.Tensor, k: int, code: str = FP16_CODE) -> tuple[np.ndarray, np.ndarray]:
    """top_entries' indices and values, every entry kept."""
    idx, vals, _ = top_entries(logits, k, code)
    return idx, vals


def stored_values(logits: torch.Tensor, logp: torch.Tensor, idx: torch.Tensor,
                  keep: torch.Tensor, code: str) -> torch.Tensor:
    """The values the student will read for the top-k classes `idx` (best first) of
    `logits` (`logp`: their log_softmax), of which `keep` are stored, under `code`: fp16
    logits, or the sqrt<L> code's levels as log-probabilities (records.quantize_ranked)."""
    if code == FP16_CODE:
        return logits.gather(-1, idx).to(torch.float16).float()
    levels = sqrt_levels(code)
    q = quantize_ranked(logp.gather(-1, idx).cpu().numpy(), keep.cpu().numpy(), levels)
    return torch.from_numpy(dequantize_sqrt(q, levels)).to(logits.device)


def kept_for_mass(top_logp: torch.Tensor, mass: float) -> torch.Tensor:
    """[..., k] log-probabilities of a frame's top-k, best first -> the fewest entries whose
    probability sums to `mass` (k when the top-k hold less): a confident frame keeps 1 or
    2 entries, an uncertain one up to k (targets.mass; Kaldi's pruned posteriors)."""
    cum = top_logp.exp().cumsum(-1)
    return 1 + (cum[..., :-1] < mass).sum(-1)


def fidelity(logits: torch.Tensor, ks: Iterable[int] = FIDELITY_KS,
             fill: float = -1.0e4, mass: float = 1.0,
             code: str = FP16_CODE) -> dict[int, dict[str, float]]:
    """Per k: probability mass the top-k keep, KL divergences, argmax agreement and the
    entries kept per frame (k, or fewer with `mass` < 1: kept_for_mass).

    The rebuilt distribution q is the softmax of the stored (fp16) top-k logits with
    every other logit set to `fill`, i.e. the teacher's top-k renormalised (the values as
    `code` stores them: stored_values). Two KLs:
    - `kl_nats` = KL(q || p): what the student learns instead of p; for renormalised
      top-k it equals -log(mass kept), so it is small exactly when the top-k hold the mass;
    - `kl_full_nats` = KL(p || q): it charges every bit of dropped mass |fill| nats,
      so it reads large by construction even for a good k.
    Sums (not means) are returned with 'frames', so shards aggregate exactly;
    `summarise_fidelity` turns them into means.
    """
    logits = logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    p = logp.exp()
    out: dict[int, dict[str, float]] = {}
    ks = [k for k in ks if k <= logits.shape[-1]]
    # one top-k of the largest k, best first: each smaller k's top-k is its prefix
    ranked = torch.topk(logits, max(ks), dim=-1).indices if ks else None
    for k in ks:
        idx = ranked[..., :k]
        kept = torch.ones(idx.shape, dtype=torch.bool, device=logits.device)
        if mass < 1.0:  # dropped entries weigh what a class outside the top-k weighs
            kept = (torch.arange(k, device=logits.device)
                    < kept_for_mass(logp.gather(-1, idx), mass)[:, None])
        # what the student will actually see
        vals = stored_values(logits, logp, idx, kept, code).masked_fill(~kept, fill)
        q_log = teacher_log_probs(idx, vals, logits.shape[-1], fill)
        q = q_log.exp()
        kept_mass = (p.gather(-1, idx) * kept).sum(-1)
        kl_q_p = (q * (q_log - logp)).sum(-1)
        kl_p_q = (p * (logp - q_log)).sum(-1)
        agree = (q_log.argmax(-1) == logits.argmax(-1)).float()
        out[k] = {"frames": float(logits.shape[0]), "mass_sum": float(kept_mass.sum()),
                  "kl_sum": float(kl_q_p.sum()), "kl_full_sum": float(kl_p_q.sum()),
                  "argmax_agree_sum": float(agree.sum()),
                  "entries_sum": float(kept.sum())}
    return out


def summarise_fidelity(parts: Iterable[dict]) -> dict[str, dict[str, float]]:
    acc: dict[str, dict[str, float]] = {}
    for part in parts:
        for k, d in part.items():
            a = acc.setdefault(str(k), {"frames": 0.0, "mass_sum": 0.0, "kl_sum": 0.0,
                                        "kl_full_sum": 0.0, "argmax_agree_sum": 0.0,
                                        "entries_sum": 0.0})
            # shard markers written before targets.mass kept every entry: frames x k
            d = {"entries_sum": d["frames"] * int(k), **d}
            for key in a:
                a[key] += d[key]
    return {k: {"frames": int(a["frames"]),
                "mass_kept": a["mass_sum"] / max(a["frames"], 1),
                "kl_nats": a["kl_sum"] / max(a["frames"], 1),
                "kl_full_nats": a["kl_full_sum"] / max(a["frames"], 1),
                "argmax_agreement": a["argmax_agree_sum"] / max(a["frames"], 1),
                "entries_per_frame": a["entries_sum"] / max(a["frames"], 1)}
            for k, a in sorted(acc.items(), key=lambda kv: int(kv[0]))}


class TeacherScorer:
    """Runs a teacher over utterances in length-sorted, padded batches."""

    def __init__(self, model: torch.nn.Module, mean: np.ndarray, inv_std: np.ndarray,
                 device: str = "cpu", dtype: torch.dtype = torch.float32,
                 batch_frames: int = 8000, max_frames: int = 20000, overlap: int = 50):
        self.device = torch.device(device)
        self.dtype = dtype  # see inference_dtype
        self.model = model.to(self.device, self.dtype).eval()
        self.mean = torch.from_numpy(mean).to(self.device)
        self.inv_std = torch.from_numpy(inv_std).to(self.device)
        self.batch_frames = batch_frames
        self.max_frames = max_frames
        self.overlap = overlap

    def _normalise(self, x: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(x).to(self.device)
        return ((t - self.mean) * self.inv_std).to(self.dtype)

    def _batches(self, feats: Sequence[np.ndarray]):
        """Yields (logits on the device [B, T, C], [(utt, start, keep_s, keep_e) per row])
        over length-sorted padded batches of every utterance's pieces."""
        pieces: list[tuple[int, int, int, int, int]] = []  # (utt, start, end, keep_s, keep_e)
        for u, x in enumerate(feats):
            for span in chunk_spans(len(x), self.max_frames, self.overlap):
                pieces.append((u, *span))
        lengths = [p[2] - p[1] for p in pieces]
        for batch in length_batches(lengths, self.batch_frames):
            xs = [self._normalise(feats[pieces[i][0]][pieces[i][1]:pieces[i][2]]) for i in batch]
            lens = torch.tensor([len(x) for x in xs])
            padded = torch.nn.utils.rnn.pad_sequence(xs, batch_first=True)
            rows = [(pieces[i][0], pieces[i][1], pieces[i][3], pieces[i][4]) for i in batch]
            yield self.model(padded, lens), rows

    @staticmethod
    def _stitch(outputs: list[list[tuple[int, Any]]], join: Callable) -> list:
        return [join([t for _, t in sorted(o, key=lambda z: z[0])]) if o else None
                for o in outputs]

    @torch.inference_mode()
    def score(self, feats: Sequence[np.ndarray]) -> list[torch.Tensor]:
        """Full-rate logits (float32, on CPU) for each utterance, in input order."""
        outputs: list[list[tuple[int, torch.Tensor]]] = [[] for _ in feats]
        for logits, rows in self._batches(feats):
            logits = logits.float().cpu()
            for row, (u, start, keep_s, keep_e) in enumerate(rows):
                outputs[u].append((keep_s, logits[row, keep_s - start:keep_e - start]))
        return [torch.zeros(0, 1) if t is None else t
                for t in self._stitch(outputs, torch.cat)]

    @torch.inference_mode()
    def score_topk(self, feats: Sequence[np.ndarray], k: int, full: Iterable[int] = (),
                   mass: float = 1.0, code: str = FP16_CODE) -> list["Scored"]:
        """Per utterance: the top-k (int16 indices, values as `topk` gives them for `code`)
        per frame, with `mass` < 1
        the entries each frame keeps (kept_for_mass), whether every logit was finite,
        and the full float32 logits for the utterances in `full` only.

        The top-k are taken where the model ran: on a GPU only k of C values per frame
        cross to the host (at 3,183 classes a 32k-frame batch is 400 MB of logits)."""
        full = set(full)
        parts: dict[str, list[list[tuple[int, Any]]]] = {
            n: [[] for _ in feats] for n in ("idx", "val", "len", "finite", "full")}
        for logits, rows in self._batches(feats):
            idx, val, lens = top_entries(logits, k, code, mass)
            host = {"idx": idx, "val": val, "finite": torch.isfinite(logits).all(-1).cpu().numpy()}
            if lens is not None:
                host["len"] = lens
            for row, (u, start, keep_s, keep_e) in enumerate(rows):
                cut = slice(keep_s - start, keep_e - start)
                for n, a in host.items():
                    parts[n][u].append((keep_s, a[row, cut]))
                if u in full:
                    parts["full"][u].append((keep_s, logits[row, cut].float().cpu()))
        idx, val, lens, fin = (self._stitch(parts[n], np.concatenate)
                               for n in ("idx", "val", "len", "finite"))
        logits_of = self._stitch(parts["full"], torch.cat)
        empty = np.zeros((0, k), np.int16), np.zeros((0, k), np.float32)
        pruned_empty = np.zeros(0, np.uint8) if mass < 1.0 else None
        return [Scored(idx[u], val[u], bool(fin[u].all()), logits_of[u], lens[u])
                if idx[u] is not None else Scored(*empty, True, None, pruned_empty)
                for u in range(len(feats))]


@dataclass
class Scored:
    """One utterance's teacher output as `targets` stores it (see TeacherScorer.score_topk)."""
    topk_idx: np.ndarray  # [T, k] int16
    topk_logit: np.ndarray  # [T, k] fp16 logits, or float32 log-probabilities (sqrt codes)
    finite: bool
    logits: torch.Tensor | None  # [T, C] float32, only where asked for
    topk_len: np.ndarray | None = None  # [T] uint8 entries kept per frame (targets.mass < 1)


# ---------------------------------------------------------------- shell
def resolve_device(requested: str) -> str:
    """Resolved where the model runs (inside the actor), not on the driver."""
    if requested != "auto":
        return requested
    return "cuda" if torch.cuda.is_available() else "cpu"


def inference_dtype(tc: TargetsConfig, device: str) -> torch.dtype:
    """On GPUs fp16 where it pays (`targets.fp16: auto`: GPUs before Ampere) or where
    asked; on CPUs bf16 where the CPU computes it natively (cpu_precision auto), else
    fp32. `fp16_on_cpu` forces the GPU path onto the CPU (tests, debugging)."""
    if device == "cuda":
        half = precision.gpu_fp16_pays() if tc.fp16 == "auto" else tc.fp16
        return torch.float16 if half else torch.float32
    if tc.fp16 is not False and tc.fp16_on_cpu:
        return torch.float16
    if tc.cpu_precision == "bf16" or (tc.cpu_precision == "auto"
                                      and precision.cpu_has_native_bf16()):
        return torch.bfloat16
    return torch.float32


# (storage, model uri) -> (model in eval mode, model-file metadata): training.checkpoint's
# load_model, handed in by the step so that this data-pipeline layer never imports training/.
ModelLoader = Callable[[Any, str], tuple[torch.nn.Module, dict[str, Any]]]


@dataclass(frozen=True)
class TargetsJob:
    """What every scoring actor needs: the storage, the targets settings, the features it
    scores (`features_uri`: shards/, cmvn.json) and where the targets go (`out_uri`:
    shards/, rejects/, and each shard's done-marker under _shards/)."""
    storage: StorageConfig
    targets: TargetsConfig
    features_uri: str
    out_uri: str


class TargetActor:
    """One teacher per actor; scores whole shards and publishes their outputs."""

    def __init__(self, job: TargetsJob, model_uri: str, load_model: ModelLoader):
        tc = job.targets
        torch.set_num_threads(tc.threads_per_actor)
        device = resolve_device(tc.device)
        if device == "cuda" and not torch.cuda.is_available():
            raise StepError("targets.device=cuda but this actor sees no GPU")
        self.device = device
        self.job, self.storage = job, Storage(job.storage)
        model, meta = load_model(self.storage, model_uri)
        card = ModelCard.from_meta(meta, model_uri)
        cmvn = card.cmvn or self.storage.read_json(join(job.features_uri, "cmvn.json"))
        mean, inv_std = load_cmvn(cmvn)
        self.num_classes = model.output.out_features
        dtype = inference_dtype(tc, device)
        self.fp16 = dtype == torch.float16
        self.precision = str(dtype).removeprefix("torch.")
        self.scorer = TeacherScorer(model, mean, inv_std, device=device, dtype=dtype,
                                    batch_frames=tc.batch_frames, max_frames=tc.max_frames)

    def info(self) -> dict[str, Any]:
        return {"device": self.device, "fp16": self.fp16, "precision": self.precision}

    def ready(self) -> dict[str, Any]:
        import ray  # deferred: importing ray fixes its client settings (auth token) for the process

        return {**self.info(), "gpu_ids": ray.get_gpu_ids()}

    def score_shard(self, shard_id: str, fidelity_frames: int = 0) -> dict[str, Any]:
        """Score one feature shard; measure fidelity on its first `fidelity_frames` frames."""
        st, job, tc = self.storage, self.job, self.job.targets
        t0 = time.perf_counter()
        rows = list(iter_rows(read_table(st, join(job.features_uri, "shards",
                                                  f"{shard_id}.parquet"))))
        feats, keep, rejects = [], [], []
        for r in rows:
            x = decode_feats(r)
            if x.shape[0] == 0 or not np.isfinite(x).all():
                rejects.append(Reject(r["utt_id"], "bad_features",
                                      f"{x.shape[0]} frames, finite={np.isfinite(x).all()}",
                                      shard_id))
                continue
            feats.append(x)
            keep.append(r)
        scored = self.scorer.score_topk(feats, tc.k, fidelity_sample(feats, fidelity_frames),
                                        tc.mass, tc.codec)
        out_rows, frames, entries, fid_parts = [], 0, 0, []
        sample_budget = fidelity_frames
        for r, sc in zip(keep, scored):
            if not sc.finite:
                rejects.append(Reject(r["utt_id"], "non_finite_teacher_output", "", shard_id))
                continue
            out_rows.append({"utt_id": r["utt_id"],
                             **encode_topk(sc.topk_idx, sc.topk_logit, sc.topk_len,
                                           tc.codec, self.num_classes)})
            frames += len(sc.topk_idx)
            entries += len(sc.topk_idx) * sc.topk_idx.shape[1] if sc.topk_len is None \
                else int(sc.topk_len.sum())
            if sample_budget > 0 and sc.logits is not None:
                fid_parts.append(fidelity(sc.logits[:sample_budget], mass=tc.mass,
                                          code=tc.codec))
                sample_budget -= len(sc.logits)
        out = to_table(out_rows, target_schema(out_rows[0]["topk_code"] if out_rows else None))
        nbytes = st.write_parquet(join(job.out_uri, "shards", f"{shard_id}.parquet"), out,
                                  compression_level=tc.zstd_level)
        st.write_parquet(join(job.out_uri, "rejects", f"{shard_id}.parquet"),
                         rejects_table(rejects))
        stats = {"shard": shard_id, "in": len(rows), "out": len(out_rows),
                 "rejected": len(rejects), "frames": frames, "entries": entries,
                 "bytes": nbytes,
                 "seconds": time.perf_counter() - t0, "fidelity": fid_parts}
        st.write_json(shard_marker_uri(job.out_uri, shard_id), stats)
        return stats


def fidelity_sample(feats: Sequence[np.ndarray], frames: int) -> list[int]:
    """The utterances whose full logits the fidelity measure reads: the first ones, in
    shard order, until `frames` frames."""
    out = []
    for u, x in enumerate(feats):
        if frames <= 0:
            break
        out.append(u)
        frames -= len(x)
    return out


def print_fidelity(fid: dict[str, dict[str, float]], k: int) -> None:
    print("top-k fidelity (sampled frames):\n    k  entries  mass_kept  KL(rebuilt||full)  "
          "KL(full||rebuilt)  argmax_agree")
    for key, d in fid.items():
        mark = "  <- stored" if int(key) == k else ""
        print(f"  {int(key):>3}  {d['entries_per_frame']:7.2f}  {d['mass_kept']:9.4f}  "
              f"{d['kl_nats']:17.4f}  {d['kl_full_nats']:17.1f}  "
              f"{d['argmax_agreement']:12.4f}{mark}")


def full_posterior_bytes_per_frame(num_classes: int) -> int:
    return 2 * num_classes  # fp16


def topk_bytes_per_frame(k: int) -> int:
    return k * (2 + 2)  # int16 index + fp16 logit
