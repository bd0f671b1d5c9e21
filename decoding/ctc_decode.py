"""Decoding a CTC model (train.model ctc) to words: `amflow decode` with a CTC model.

    amflow decode --model runs/<R>/train-ctc/model.pt --run-id R [--split test] [--out F]

Same inputs, outputs and `--out` JSON as the hybrid decode (decoding/decode.py: WER, CIs,
per condition, S/D/I, errors.txt, hyps), with the CTC model's own search:
    decode.ctc_search tlg     T o L o G (decoding/ctc_graph.py; the LM is the run's
                              lm/lm.arpa or decode.lm; cached under runs/<R>/graph/<key>/)
                              searched by FasterDecoder over acwt x log p, the blank's
                              log-probability lowered by the blank penalty
    decode.ctc_search greedy  the best token per frame, repeats and blanks removed
The LM weight (acwt = 1 / weight) and the blank penalty are tuned on decode.tune_split
over decode.ctc_lm_weights x decode.blank_penalties (greedy: the penalties alone); the
best pair scores --split. The model's tokenizer comes from its model card (info.tokenizer).
"""
from __future__ import annotations

import logging
import time
from typing import Any, Sequence

import numpy as np

from core.config import Config, DecodeConfig, StorageConfig
from core.outcomes import StepError
from core.storage import Storage, join
from decoding import decode as D
from decoding import error_analysis
from decoding.batching import batched
from decoding.graph import read_graph
from decoding.ctc_prefix import prefix_beam_search, rescore
from decoding.search import Searcher

log = logging.getLogger(__name__)


def ctc_scores(log_probs: np.ndarray, acwt: float, blank_penalty: float) -> np.ndarray:
    """The matrix DecodableCtc reads: acwt x log p, the blank's column minus the penalty."""
    x = np.array(log_probs, dtype=np.float32)
    x[:, 0] -= blank_penalty
    return np.ascontiguousarray(acwt * x, dtype=np.float32)


def greedy_words(log_probs: np.ndarray, tokenizer, blank_penalty: float = 0.0) -> list[str]:
    best = ctc_scores(log_probs, 1.0, blank_penalty).argmax(-1)
    keep = np.ones(len(best), bool)
    keep[1:] = best[1:] != best[:-1]
    return tokenizer.decode(int(i) for i in best[keep] if i != 0)


def ctc_log_probs(model, feats: Sequence[np.ndarray], batch_frames: int = 20000,
                  keep_encoder: bool = False) -> list[Any]:
    """Per utterance, the model's log-probabilities over its output frames [T', C]
    (with `keep_encoder`: (those, the encoder's outputs [T', D]), for attention
    rescoring); length-sorted padded batches (padding never reaches a real frame)."""
    import torch

    def forward(x: np.ndarray, lens: np.ndarray) -> list[Any]:
        with torch.no_grad():
            h, n = model.encode(torch.from_numpy(x), torch.from_numpy(lens))
            y = torch.log_softmax(model.ctc_output(h, n).float(), -1).numpy()
            n = n.clamp_max(y.shape[1]).tolist()
        return [(y[j, :n[j]], h[j, :n[j]].numpy()) if keep_encoder else y[j, :n[j]]
                for j in range(len(n))]

    return batched(feats, forward, batch_frames)


class CtcDecodeWorker:
    """A Ray actor holding a CTC model and (tlg) its graph: featurises, scores, searches
    (`mode`: decode.ctc_search)."""

    def __init__(self, model_bytes: bytes, graph_dir: str, corpus: str, storage_cfg: StorageConfig,
                 beam: float, max_active: int, batch_frames: int = 20000, threads: int = 1,
                 mode: str = "tlg", nbest: int = 8, gate: Any = None):
        import torch

        from training.checkpoint import card_from_bytes
        from training.ctc.tokens import Tokenizer

        torch.set_num_threads(threads)
        self.model, self.card = card_from_bytes(model_bytes)
        self.tokenizer = Tokenizer.from_dict(self.card.tokenizer)
        self.searcher = Searcher(read_graph(graph_dir), beam, max_active) if graph_dir else None
        self.corpus, self.batch_frames = corpus, batch_frames
        self.mode, self.nbest = mode, nbest
        if mode == "rescore" and getattr(self.model, "decoder", None) is None:
            raise StepError("decode.ctc_search rescore needs a joint CTC/attention model "
                            "(model.ctc.attention_weight > 0); this one has no decoder")
        self.storage = Storage(storage_cfg)
        self.gate = gate  # D.decode_gate's

    def score(self, records: list) -> dict:
        t0 = time.perf_counter()
        feats, rejects, audio_s = D.featurize(self.storage, self.corpus, records, self.card,
                                              self.gate)
        t1 = time.perf_counter()
        out = D.with_rows(lambda xs: ctc_log_probs(self.model, xs, self.batch_frames,
                                                   keep_encoder=self.mode == "rescore"),
                          [x for _, x in feats])
        utts = [(r, *o) if isinstance(o, tuple) else (r, o) for (r, _), o in zip(feats, out)]
        return {"utts": utts, "rejects": rejects,
                "audio_s": audio_s, "featurize_s": t1 - t0, "forward_s": time.perf_counter() - t1}

    def search(self, utts: list, setting: dict) -> dict:
        t0 = time.perf_counter()
        hyps = []
        for rec, lp, *enc in utts:
            if lp is None:  # the speech gate kept no row: no words
                hyps.append((rec, [], True))
            elif self.mode == "rescore":
                hyps.append((rec, self._rescored(lp, enc[0], setting["blank_penalty"]), True))
            elif self.searcher is None:
                hyps.append((rec, greedy_words(lp, self.tokenizer, setting["blank_penalty"]), True))
            else:
                words, _, final = self.searcher.best_words(
                    ctc_scores(lp, setting["acwt"], setting["blank_penalty"]))
                hyps.append((rec, words, final))
        return {"hyps": hyps, "search_s": time.perf_counter() - t0,
                "frames": sum(len(u[1]) for u in utts if u[1] is not None)}

    def _rescored(self, lp: np.ndarray, enc: np.ndarray, blank_penalty: float) -> list[str]:
        """The CTC prefix beam's n-best rescored by the attention decoder."""
        import torch

        nbest = prefix_beam_search(lp, self.nbest, blank_penalty)
        att = self.model.decoder.score(torch.tensor(enc), len(enc),
                                       [list(y) for y, _ in nbest])
        best = rescore(nbest, att, self.model.attention_weight)
        return self.tokenizer.decode(nbest[best][0]) if best >= 0 else []


def settings(dc: DecodeConfig, greedy: bool) -> list[dict]:
    """The (LM weight, blank penalty) pairs tuning tries; greedy: the penalties alone."""
    weights = [1.0] if greedy else list(dc.ctc_lm_weights)
    return [{"lm_weight": w, "acwt": round(1.0 / w, 6), "blank_penalty": float(b)}
            for w in weights for b in dc.blank_penalties]


def tune(dc: DecodeConfig, storage: Storage, pool: D.Pool, corpus: str, vocab, greedy: bool
         ) -> tuple[list[dict], dict]:
    """WER on decode.tune_split per setting; the best (first on ties)."""
    grid = settings(dc, greedy)
    if not dc.tune_split or len(grid) == 1:
        return [], grid[0]
    recs, _ = D.split_records(storage, corpus, dc.tune_split)
    scored = pool.score(D.shards_of(recs, 2 * dc.workers), f"tune on {dc.tune_split}: features+model")
    rows = []
    for s in grid:
        hyps, _, _ = pool.search(scored, s, f"tune lm {s['lm_weight']} blank {s['blank_penalty']}")
        rows.append({**s, "wer": D.score_hyps(hyps, vocab)[0]["wer"]})
        log.info("tuning on %s: %s WER %.2f %%", dc.tune_split, s, 100 * rows[-1]["wer"])
    best = min(rows, key=lambda r: r["wer"])
    return rows, {k: best[k] for k in ("lm_weight", "acwt", "blank_penalty")}


def decode_ctc(cfg: Config, out_uri: str, model_uri: str, model_bytes: bytes, card,
               corpus: str, split: str, graph: tuple[str, dict, set] | None, lm_uri: str | None
               ) -> tuple[dict, dict]:
    """Tune, score and search `split` with a CTC model, writing hyps and errors.txt into
    `out_uri`; (result.json body, step summary). `graph`: (local graph dir, its info, its
    vocabulary) for tlg (built with the LM at `lm_uri`), None for greedy and rescore (no
    LM: the penalties alone are tuned)."""
    dc, storage = cfg.decode, Storage(cfg.storage)
    recs, rejects = D.split_records(storage, corpus, split)
    n_in = len(recs) + len(rejects)
    graph_dir, info, vocab = graph or ("", {}, None)
    t0 = time.perf_counter()
    pool = D.Pool(cfg, model_bytes, graph_dir, None, corpus, worker=CtcDecodeWorker,
                  worker_args=(graph_dir, corpus, cfg.storage, dc.beam, dc.max_active,
                               dc.batch_frames, 1, dc.ctc_search, dc.ctc_nbest,
                               D.decode_gate(cfg)),
                  inline=D.inline_for(cfg, storage, corpus, recs, [dc.tune_split]))
    tuning, best = tune(dc, storage, pool, corpus, vocab or _AnyWord(), graph is None)
    scored = pool.score(D.shards_of(recs, 2 * dc.workers), f"decode {split}: features+model")
    hyps, search_s, frames = pool.search(scored, best, f"decode {split}: search")
    wall = time.perf_counter() - t0
    rejects += [r for s in scored for r in s["rejects"]]
    result, rows, oov = D.score_hyps(hyps, vocab or _AnyWord())
    result.update(error_analysis.result_fields(rows))
    audio_s = sum(s["audio_s"] for s in scored)
    result.update({
        "model": model_uri, "data": corpus, "split": split, **best,
        "search": dc.ctc_search, "tune_split": dc.tune_split,
        "tuning": tuning, "lm": lm_uri if graph is not None else None, "graph": info,
        "priors_from": None, "oov": oov, "rejected": D.reasons(rejects),
        "audio_s": round(audio_s, 2), "rtf": D.rtf(scored, search_s, audio_s, wall, pool.workers),
        "model_kind": card.kind,
        "tokenizer": {k: card.tokenizer[k] for k in ("kind", "digest")}})
    D.write_hyps(storage, out_uri, rows)
    storage.write_text(join(out_uri, "errors.txt"), error_analysis.render(rows))
    metrics = D.step_metrics(result, scored, frames, **best, search=result["search"])
    return result, {"metrics": metrics, "rejects": rejects,
                    "counts": {"in": n_in, "out": len(hyps), "rejected": len(rejects)}}


class _AnyWord:
    """Greedy decoding has no vocabulary: no reference word is out of it."""

    def __contains__(self, word: str) -> bool:
        return True


def check_ctc_card(card, model_uri: str) -> None:
    if not card.tokenizer:
        raise StepError(f"{model_uri} is a ctc model without its tokenizer (info.tokenizer): "
                        "retrain it with this version of amflow")
    if not card.cmvn or not card.features:
        raise StepError(f"{model_uri} carries no cmvn/features: decode needs a "
                        "self-describing model.pt")
