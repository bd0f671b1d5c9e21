"""`amflow evaluate`: frame accuracy and phone error rate of a model on a corpus split
(the scoring: training/evaluate.py).

The step resolves the run layout: the default model is this run's
`train[-<evaluate.tag>]/model.pt` (or the sequence training a tag names), a model file
without CMVN stats or a phone list falls back to the run's features/cmvn.json and
phones.json, and the outputs go to runs/<R>/evaluate[-<tag>]/ (result.json, rejects/,
_SUCCESS.json) unless --out names the result elsewhere. A rerun on the same inputs
(`evaluate_inputs`: the models by digest, corpus, settings, reference) hands back the
finished evaluation, as decode does.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from core.config import features_dict
from core.runs import StepContext, StepError, rejects_table, step_dir_name
from core.storage import digest_of, join
from tasks.alignments import AlignOutputsError, read_align_labels
from tasks.select import corpus_fingerprint
from tasks.speech.lexicon import LexiconError, read_lexicon
from training.checkpoint import card_from_bytes
from training.evaluate import evaluate_split, labels_in_model_classes, print_table
from training.families import get_family
from amflow.services.train_plan import model_dir_name


def _from_run(ctx: StepContext, value: Any, name: str, model_uri: str, what: str) -> Any:
    """A model file's own `value`, else the run's features/<name>."""
    if value:
        return value
    uri = ctx.other("features", name)
    if not ctx.storage.exists(uri):
        raise StepError(f"{model_uri} carries no {what} and {uri} does not exist")
    return ctx.storage.read_json(uri)


def _pronunciations(ctx: StepContext, corpus: str) -> dict[str, list[tuple[str, ...]]] | None:
    """The lexicon's pronunciations (data.lexicon, else <corpus>/lexicon.txt), None when
    there is none."""
    uri = ctx.cfg.data.lexicon_uri(corpus)
    if not ctx.storage.exists(uri):
        return None
    try:
        return read_lexicon(ctx.storage.read_text(uri)).prons
    except LexiconError as exc:
        raise StepError(f"{uri}: {exc}") from exc


# evaluate.* keys that place or pace the scoring, or name where it goes
OPERATIONAL_KEYS = {"tag", "batch_frames"}


def read_models(ctx: StepContext, model: str) -> dict[str, bytes]:
    """The model's and evaluate.baseline's bytes (the baseline when it exists), read once:
    the digests evaluate_inputs keeps are those of the models then scored."""
    st, baseline = ctx.storage, ctx.cfg.evaluate.baseline
    read = {model: st.read_bytes(model)}
    if baseline and baseline not in read and st.exists(baseline):
        read[baseline] = st.read_bytes(baseline)
    return read


def evaluate_inputs(ctx: StepContext, model: str, corpus: str, split: str, reference: str,
                    read: dict[str, bytes]) -> dict[str, Any]:
    """What an evaluation's scores depend on: the model (and evaluate.baseline) by digest
    of `read_models`' bytes,
    the corpus (`corpus_fingerprint`) and split, the settings that compute the features
    and the scores, and the reference: the corpus CTM (part of the corpus), this run's
    align labels (`align`: when align finished) or the lexicon's pronunciations
    (`lexicon`: by digest). Also when this run's features finished: a model without
    CMVN stats or phones reads them there."""
    st, cfg = ctx.storage, ctx.cfg
    baseline = cfg.evaluate.baseline
    lexicon = cfg.data.lexicon_uri(corpus)
    return {"model": model, "model_digest": digest_of(read[model]), "data": corpus,
            "data_fingerprint": corpus_fingerprint(st, corpus), "split": split,
            "evaluate": {k: v for k, v in dataclasses.asdict(cfg.evaluate).items()
                         if k not in OPERATIONAL_KEYS},
            "baseline_digest": digest_of(read[baseline]) if baseline in read else None,
            "features": features_dict(cfg.features),
            "features_finished_at": ctx.finished_at("features"),
            "reference": reference,
            "align_finished_at": ctx.finished_at("align") if reference == "align" else None,
            "lexicon_digest": st.digest(lexicon) if reference != "ctm" and st.exists(lexicon)
            else None}


def run(ctx: StepContext, args: Any = None) -> dict[str, Any]:
    cfg = ctx.cfg
    tag = cfg.evaluate.tag
    step = step_dir_name("evaluate", tag)
    if ctx.step != step:
        started = ctx.started
        ctx = StepContext(cfg, ctx.run_id, step, force=ctx.force)
        ctx.started = started
    st = ctx.storage
    model_uri = getattr(args, "model", None) or ctx.other(model_dir_name(tag), "model.pt")
    corpus = getattr(args, "data", None) or cfg.data.corpus
    split = getattr(args, "split", None) or "test"
    out_uri = getattr(args, "out", None) or ctx.path("result.json")
    if not st.exists(model_uri):
        raise StepError(f"model {model_uri} not found: train one with `amflow train` or pass "
                        "--model URI")
    read = read_models(ctx, model_uri)
    model, card = card_from_bytes(read[model_uri], model_uri)
    if get_family(card.kind).token_targets:
        raise StepError(f"{model_uri} is a CTC model: it has no frame classes to score; "
                        "`amflow decode` gives its WER")
    has_ctm = st.exists(join(corpus.rstrip("/"), "alignments.ctm"))
    inputs = evaluate_inputs(ctx, model_uri, corpus, split,
                             "ctm" if has_ctm else "align" if card.context else "lexicon", read)
    done = ctx.finished_on(inputs, out_uri)
    if done is not None:
        return done
    cmvn = _from_run(ctx, card.cmvn, "cmvn.json", model_uri, "CMVN stats")
    phones = _from_run(ctx, card.phones, "phones.json", model_uri, "phone list")
    frame_labels, prons = None, None
    # The corpus CTM's phones are the reference when the corpus has one (what the aligner
    # is measured on). Without one: leaf classes against this run's align step where it
    # aligned the split, else every model by PER against the transcripts (the lexicon's
    # pronunciations), as a corpus of real transcribed speech has no frame reference.
    if not has_ctm:
        prons = _pronunciations(ctx, corpus)
        if card.context:
            try:
                tree, labels = read_align_labels(st, ctx.other("align"))
                frame_labels = labels_in_model_classes(card.context, tree, labels)
            except AlignOutputsError as exc:
                if prons is None:
                    raise StepError(f"{model_uri} has context-dependent classes: {exc}") from exc
            if frame_labels is None and prons is None:
                raise StepError(f"{model_uri}'s network tree is not the one this run's align "
                                "step labelled with, and the corpus has no lexicon to score "
                                "it by PER")
    ev = evaluate_split(st, model, card, model_uri, cmvn, phones, corpus, split,
                        cfg.evaluate, cfg.features, frame_labels, prons,
                        read.get(cfg.evaluate.baseline))
    result = ev.result
    st.write_json(out_uri, result)
    if ev.rejects:
        st.write_parquet(ctx.path("rejects", "rejects.parquet"), rejects_table(ev.rejects))
    print_table(result)
    metrics = {k: result[k] for k in ("frame_accuracy", "per", "per_speech", "num_frames",
                                      "num_utterances", "per_condition", "per_condition_per",
                                      "reference")}
    if "rel_frame_error_reduction" in result:
        metrics["rel_frame_error_reduction"] = result["rel_frame_error_reduction"]
    return ctx.finish(inputs=inputs,
                      counts={"in": ev.records_in, "out": ev.scored, "rejected": len(ev.rejects)},
                      metrics=metrics, extra={"out": out_uri})
