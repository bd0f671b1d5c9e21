"""`amflow sequence`: `amflow train` with train.regime=sequence (the CLI sets it): sMBR /
MMI training of a trained model into runs/<R>/sequence[-<train.tag>]/, then the model to
ship chosen on dev.

Sequence training on a few labeled minutes can make a model worse (the demo once saw its
SSL student lose 1.9 points), so with train.sequence_select=dev_wer (the default) the step
does not ship its last epoch blindly: the CE model it started from (train.init_model or
train[-<tag>]/model.pt) and the model after every epoch (epochs/epoch-<k>.pt, written by
the trainer) are decoded on a fixed subset of the dev split (decode.tune_split;
train.sequence_select_utts utterances, the same ones for every candidate) the way
`amflow decode` tunes: the CE model at every decode.acwt, each epoch at the CE model's
best and its neighbours in that grid; a candidate's WER is the best of its. An epoch
is a candidate only when it beats the CE model by more than chance on those utterances:
the paired test (decoding/significance.py, the one `amflow compare` runs) gives p <
train.sequence_select_alpha (0.05). On a small dev subset a lower WER alone is mostly
noise: the 2026-12-07 demo shipped an epoch 0.40 points better on 60 dev utterances (p =
0.62) that was 1.76 points worse on test (p = 0.003). The lowest WER among the CE model
and those epochs wins, the earliest on ties, so the CE model wins a tie: model.pt becomes
the winner's bytes (the CE model's own when it wins). `_SUCCESS.json` metrics `selection`
say which won, every candidate's dev WER and acwt, the winner's paired test against the
CE model, and dev's lowest epoch where the test rejected it (`rejected`).
train.sequence_select=dev_frames chooses by the dev frame error the trainer measured
instead (no decoding; dev_wer's fallback, with a warning, when the run has no LM yet);
train.sequence_select=last ships the last epoch (the step before this choice existed).

The scoring runs in this process with the decode step's worker (no Ray pool: the subset
is small) and the run's cached graph (runs/<R>/graph/, the one `amflow decode` built).
"""
from __future__ import annotations

import hashlib
import logging
from typing import Any

from core.config import ConfigError
from core.runs import StepContext, StepError
from decoding import decode as D
from decoding.significance import compare_rows
from training.checkpoint import load_model_card
from training.loop import epoch_model_uri
from training.priors import attach_priors
from amflow.services.decoder_setup import load_assets, lm_uri
from amflow.services.training import run_training

log = logging.getLogger(__name__)


def run(ctx: StepContext, args: Any = None) -> dict[str, Any]:
    if ctx.cfg.train.recipe != "sequence":
        raise ConfigError("train.regime", f"is {ctx.cfg.train.recipe}; `amflow sequence` "
                          "runs the sequence regime")
    return run_training(ctx, args, after=choose_on_dev)


def choose_on_dev(ctx: StepContext, plan: Any, result: dict[str, Any]) -> dict[str, Any]:
    """train.run's `after`: the CE model and every epoch scored on dev, the best shipped
    as model.pt; the `selection` metrics."""
    sc = ctx.cfg.train.sequence
    model_uri = result["model_uri"]
    epochs = ctx.cfg.train.passes.epochs
    if sc.sequence_select == "last":
        return {"selection": {"rule": "last", "chosen_epoch": epochs, "epochs": epochs}}
    candidates = candidate_models(ctx, plan.init_model, plan.train_dir, model_uri, epochs)
    scores, split = dev_scores(ctx, candidates, result)
    if scores is None:
        log.warning("sequence: %s; shipping the last epoch", split)
        return {"selection": {"rule": "last", "why": split, "chosen_epoch": epochs,
                              "epochs": epochs}}
    selection = summarize(candidates, scores, split, sc.sequence_select_alpha)
    chosen_uri = candidates[selection["chosen_index"]][1]
    if chosen_uri != model_uri:
        ctx.storage.write_bytes(model_uri, ctx.storage.read_bytes(chosen_uri))
    log.info("sequence: %s chosen on %s (%s; %s utterances): error %.2f %% against the CE "
             "model's %.2f %%", selection["chosen"], split, selection["rule"],
             selection["utterances"], 100 * selection["chosen_wer"], 100 * selection["ce_wer"])
    return {"selection": selection}


def dev_scores(ctx: StepContext, candidates: list[tuple[str, str]], result: dict[str, Any]
               ) -> tuple[list[dict[str, Any]] | None, str]:
    """(each candidate's dev score, the split), or (None, why none). dev_wer decodes a
    dev subset (`score_on_dev`); without the run's LM (no graph to decode with) it falls
    back to dev_frames: the frame error of each model on the training's dev split, as the
    trainer scored it (the CE model at the end of its own training, each epoch at its end)."""
    sc = ctx.cfg.train.sequence
    if sc.sequence_select == "dev_wer":
        lm = lm_uri(ctx)[0]
        if ctx.storage.exists(lm):
            corpus = ctx.cfg.data.corpus
            split = ctx.cfg.decode.tune_split or "dev"
            recs = dev_subset(ctx, corpus, split, sc.sequence_select_utts)
            ce = score_on_dev(ctx, candidates[0][1], corpus, recs, ctx.cfg.decode.acwt)
            grid = acwt_near(ctx.cfg.decode.acwt, ce["acwt"])
            return [ce] + [score_on_dev(ctx, uri, corpus, recs, grid)
                           for _, uri in candidates[1:]], split
        log.warning("sequence: no LM at %s to decode dev with: choosing by dev frame error "
                    "(train.sequence_select=dev_frames)", lm)
    accs = [_dev_frame_acc(ctx, uri) for _, uri in candidates[:-1]]
    accs.append(result["metrics"].get("dev_frame_acc"))
    if any(a is None for a in accs):
        return None, "no dev frame accuracy for every candidate (no dev split?)"
    split = ctx.cfg.train.batches.dev_split
    return [{"wer": 1.0 - a, "metric": "frame_error"} for a in accs], split


def _dev_frame_acc(ctx: StepContext, uri: str) -> float | None:
    """The dev frame accuracy a model file records: its training's final one (the CE
    model) or the one at the end of its epoch (a sequence epoch's model)."""
    metrics = load_model_card(ctx.storage, uri)[1].info.get("metrics") or {}
    if "epoch" in metrics:
        return (metrics.get("dev") or {}).get("frame_acc")
    return metrics.get("dev_frame_acc")


def candidate_models(ctx: StepContext, ce_uri: str, train_dir: str, model_uri: str,
                     epochs: int) -> list[tuple[str, str]]:
    """(name, URI): the CE model, each earlier epoch's model (given model.pt's priors, so
    each decodes as it would shipped) and the last epoch, model.pt itself."""
    st = ctx.storage
    if not ce_uri or not st.exists(ce_uri):
        raise StepError(f"the CE model {ce_uri!r} the sequence training started from is gone: "
                        "it is a candidate of train.sequence_select=dev_wer")
    priors = _priors(st, model_uri)
    out = [("ce", ce_uri)]
    for e in range(1, epochs):
        uri = epoch_model_uri(train_dir, e)
        if not st.exists(uri):
            raise StepError(f"{uri} is missing (the trainer writes one per epoch): re-run "
                            "with --force, or set train.sequence_select=last")
        if priors is not None:
            attach_priors(st, uri, priors["counts"], priors.get("source", "training targets"))
        out.append((f"epoch {e}", uri))
    return out + [(f"epoch {epochs}", model_uri)]


def _priors(storage, uri: str) -> dict[str, Any] | None:
    return load_model_card(storage, uri)[1].priors


def dev_subset(ctx: StepContext, corpus: str, split: str, n: int) -> list:
    """`n` utterances of `split` with transcripts (0: all), a fixed choice (by a hash of
    the utterance id, so the same ones whatever order the corpus lists them in)."""
    recs, _ = D.split_records(ctx.storage, corpus, split)
    if not recs:
        raise StepError(f"split {split!r} of corpus {corpus} has no transcribed utterances "
                        "to choose the sequence model on (decode.tune_split; or set "
                        "train.sequence_select=last)")
    if n and len(recs) > n:
        recs = sorted(recs, key=lambda r: hashlib.sha1(r.utt_id.encode()).hexdigest())[:n]
    return sorted(recs, key=lambda r: r.utt_id)


def acwt_near(grid: list[float], best: float) -> list[float]:
    """The acwt values of `grid` at most one step from `best` (in the grid's order): the
    epochs are tuned there only (sequence training moves a model's best scale little; a
    search per value is most of the choice's cost)."""
    ordered = sorted(grid)
    i = ordered.index(best)
    return ordered[max(0, i - 1):i + 2]


def score_on_dev(ctx: StepContext, model_uri: str, corpus: str, recs: list,
                 grid: list[float]) -> dict[str, Any]:
    """`amflow decode`'s tuning on `recs`: the WER at each acwt of `grid`; the best (the
    first on ties) with its acwt and its per-utterance rows (for the paired test)."""
    import torch

    dc = ctx.cfg.decode
    assets = load_assets(ctx, model_uri, corpus)
    worker = D.DecodeWorker(assets.model_bytes, assets.graph_dir, assets.log_prior, corpus,
                            ctx.cfg.storage, dc.beam, dc.max_active,
                            threads=torch.get_num_threads())
    utts = worker.score(recs)["utts"]
    best: dict[str, Any] = {}
    tuning = []
    for acwt in grid:
        res, rows, _ = D.score_hyps(worker.search(utts, acwt)["hyps"], assets.lexicon)
        tuning.append({"acwt": acwt, "wer": res["wer"]})
        if not best or res["wer"] < best["wer"]:
            best = {"wer": res["wer"], "acwt": acwt, "rows": rows}
    return {**best, "tuning": tuning}


def lowest(scores: list[dict[str, Any]]) -> int:
    """The candidate with the lowest dev error, the earliest on ties (the CE model, index
    0, wins a tie)."""
    return min(range(len(scores)), key=lambda i: (scores[i]["wer"], i))


def choose(scores: list[dict[str, Any]], alpha: float = 1.0) -> int:
    """The lowest dev error among the CE model (index 0) and the epochs that beat it by
    more than chance: with per-utterance rows (dev_wer), an epoch is a candidate only when
    the paired test of it against the CE model gives p < `alpha` (alpha 1: any gain);
    the earliest wins a tie, so the CE model keeps its place unless an epoch beats it.
    Frame errors (dev_frames) have no rows to test: the lowest wins."""
    ce = scores[0]

    def beats_ce(s: dict[str, Any]) -> bool:
        if s["wer"] >= ce["wer"]:
            return False
        if alpha >= 1 or "rows" not in ce:
            return True
        return compare_rows(ce["rows"], s["rows"])["p_mapsswe"] < alpha

    eligible = [0] + [i for i in range(1, len(scores)) if beats_ce(scores[i])]
    return min(eligible, key=lambda i: (scores[i]["wer"], i))


def summarize(candidates: list[tuple[str, str]], scores: list[dict[str, Any]],
              split: str, alpha: float = 1.0) -> dict[str, Any]:
    """The `selection` metrics: every candidate's dev error (WER, or frame error with
    dev_frames) and acwt, the winner, and its paired test against the CE model (and the
    last epoch's, the model shipped before, and dev's lowest where the test rejected it)
    where there are per-utterance rows."""
    best = choose(scores, alpha)
    ce, won, last = scores[0], scores[best], scores[-1]
    by_wer = "rows" in ce
    out = {
        "rule": "dev_wer" if by_wer else "dev_frames", "split": split,
        "utterances": len(ce["rows"]) if by_wer else None,
        "candidates": [{"name": n, "model": u, "epoch": i, "wer": s["wer"],
                        "acwt": s.get("acwt"), "tuning": s.get("tuning")}
                       for i, ((n, u), s) in enumerate(zip(candidates, scores))],
        "chosen": candidates[best][0], "chosen_index": best, "chosen_epoch": best,
        "epochs": len(candidates) - 1, "ce_wer": ce["wer"], "chosen_wer": won["wer"],
        "delta": won["wer"] - ce["wer"], "last_wer": last["wer"],
        "last_delta": last["wer"] - ce["wer"]}
    if by_wer:
        low = lowest(scores)
        tests = {i: compare_rows(ce["rows"], scores[i]["rows"])
                 for i in {best, len(scores) - 1, low}}
        test = tests[best]
        out.update({"alpha": alpha, "p_mapsswe": test["p_mapsswe"],
                    "p_bootstrap": test["p_bootstrap"], "significant": test["significant"],
                    "last_p_mapsswe": tests[len(scores) - 1]["p_mapsswe"]})
        if low != best:  # dev's lowest, not shipped: its gain did not pass the test
            out["rejected"] = {"name": candidates[low][0], "epoch": low,
                               "wer": scores[low]["wer"],
                               "delta": scores[low]["wer"] - ce["wer"],
                               "p_mapsswe": tests[low]["p_mapsswe"]}
    return out
