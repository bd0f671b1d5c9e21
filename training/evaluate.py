"""Frame accuracy and phone error rate of a model on a corpus split: the library behind
`amflow evaluate` (its step, resolving the run's paths: amflow/steps/evaluate.py).

Reads   --model  a model.pt (default: this run's `train[-<evaluate.tag>]/model.pt`)
        --data   a corpus in the input format (default: data.corpus): metadata/**.jsonl
                 (records with `split` == --split), the audio, alignments.ctm
        the model's own CMVN stats, phone list and features config (stored in model.pt;
        the run's features/cmvn.json when the model file has none)
Writes  --out    JSON (default: runs/<R>/evaluate[-<tag>]/result.json):
          frame_accuracy, num_frames, num_utterances, per (phone error rate), per_speech
          (the same without silence), per_condition {DP1..DP5: frame accuracy},
          per_condition_per, per_condition_per_speech, per_condition_frames,
          rejected {reason: count}, reference (ctm | align | transcript); with
          evaluate.baseline also `baseline` (the same numbers for that model) and
          rel_frame_error_reduction per condition
        runs/<R>/evaluate[-<tag>]/_SUCCESS.json, rejects/rejects.parquet

Features are computed on the fly exactly as the features step does
(`tasks.features.featurize_stream`: per speaker stream in `created_at` order, causal
mean normalisation, low frame rate), then the global CMVN. References are the
alignment's phone at each low-frame-rate row's centre frame (`tasks.alignments`).

PER: the frame outputs (argmax per row) are collapsed greedily (runs of one class become
one phone) and compared with the collapsed reference by edit distance; PER = total edits
/ total reference phones. Silence is a class like any other there; `per_speech` removes
the silence symbols from both collapsed sequences first, the usual way phone error rates
are reported (silence is a third of the frames and easy).

A corpus of real transcribed speech has no frame reference for its test split (no
alignments.ctm, and `amflow align` aligns the training splits). Such a split is scored by
its transcripts (`reference: transcript`): each word's pronunciations from the lexicon,
the variant closest to the collapsed output chosen per word (as a forced alignment would
choose by the audio), PER against that spelling without silence; frame accuracy is None
(`per` equals `per_speech`). Records without words or with a word not in the lexicon are
rejects (no_transcript, oov_word).
"""
from __future__ import annotations

import dataclasses
import logging
from collections import defaultdict
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from core.config import EvaluateConfig, FeaturesConfig
from core.model_card import ModelCard
from core.progress import Progress
from core.reject_hints import nothing_left
from core.outcomes import Reject, StepError
from core.senones import ContextTree, fit_frames
from core.storage import Storage, join
from tasks import alignments as al
from tasks.corpus import SIL
from tasks.fbank import FbankComputer
from tasks.features import featurize_records
from tasks.select import records_of_split
from tasks.speech.lexicon import words_of
from training.checkpoint import card_from_bytes
from training.data import Normalizer
from training.example_servers import load_clean_sources
from training.loop import dataclass_from_dict

log = logging.getLogger(__name__)


# ----------------------------------------------------------------- pure scoring
def collapse(seq: Sequence[int] | np.ndarray) -> np.ndarray:
    """Greedy collapse: consecutive repeats become one symbol."""
    a = np.asarray(seq)
    if a.size == 0:
        return a
    keep = np.ones(len(a), bool)
    keep[1:] = a[1:] != a[:-1]
    return a[keep]


def edit_distance(hyp: Sequence[int] | np.ndarray, ref: Sequence[int] | np.ndarray) -> int:
    """Levenshtein distance (substitutions, insertions, deletions all cost 1): a transcript
    of one word with one pronunciation."""
    return edit_distance_variants(hyp, [[ref]])[0]


def edit_distance_variants(hyp: Sequence[int] | np.ndarray,
                           words: Sequence[Sequence[Sequence[int]]]) -> tuple[int, int]:
    """(edits, reference length) of `hyp` against the closest spelling of a transcript
    whose words each have pronunciation variants: per word the variant that fits `hyp`
    best (of equally close ones, the shortest), as a forced alignment picks the one that
    fits the audio best."""
    h = np.asarray(hyp)
    # one integer per path: edits x _KEY + reference length, so that the smallest is the
    # fewest edits, then the shortest reference (each step adds to both)
    key = np.arange(len(h) + 1, dtype=np.int64) * _KEY  # hyp[:j] all inserted
    for variants in words:
        ends = []
        for phones in variants:
            k = key
            for p in phones:
                k = _ref_row(k, p, h)
            ends.append(k)
        if ends:
            key = np.minimum.reduce(ends)
    edits, length = divmod(int(key[-1]), _KEY)
    return edits, length


_KEY = 1 << 24


def _ref_row(key: np.ndarray, ref: int, h: np.ndarray) -> np.ndarray:
    """One reference symbol more (deletion or substitution / match consume it), then
    insertions along the row: key[j] = min over k <= j of key[k] + (j - k) insertions."""
    cur = key + _KEY + 1  # deletion
    cur[1:] = np.minimum(cur[1:], key[:-1] + (h != ref) * _KEY + 1)
    steps = np.arange(len(cur), dtype=np.int64) * _KEY
    return np.minimum.accumulate(cur - steps) + steps


@dataclasses.dataclass
class UttScore:
    condition: str
    frames: int
    correct: int
    ref_phones: int
    edits: int
    ref_speech: int = 0  # without silence
    edits_speech: int = 0


def score_utterance(pred: np.ndarray, ref: np.ndarray, condition: str,
                    silence: int = -1, to_phone: np.ndarray | None = None) -> UttScore:
    """Frame accuracy over the classes; PER over phones: with context-dependent classes
    `to_phone` maps each class to its phone (and `silence` is a phone id) first."""
    pred = np.asarray(pred)
    ref = np.asarray(ref)
    if pred.shape != ref.shape:
        raise ValueError(f"prediction {pred.shape} and reference {ref.shape} differ")
    pp, pr = (pred, ref) if to_phone is None else (to_phone[pred], to_phone[ref])
    cref, chyp = collapse(pr), collapse(pp)
    sref, shyp = cref[cref != silence], chyp[chyp != silence]
    return UttScore(condition, int(len(ref)), int((pred == ref).sum()), int(len(cref)),
                    edit_distance(chyp, cref), int(len(sref)), edit_distance(shyp, sref))


def score_transcript(pred: np.ndarray, words: Sequence[Sequence[Sequence[int]]],
                     condition: str, silence: int = -1) -> UttScore:
    """An utterance with no frame reference: PER of its collapsed prediction without
    silence against its transcript's pronunciation (edit_distance_variants); no frames."""
    hyp = collapse(pred)
    edits, n = edit_distance_variants(hyp[hyp != silence], words)
    return UttScore(condition, 0, 0, n, edits, n, edits)


def aggregate(scores: Iterable[UttScore]) -> dict[str, Any]:
    scores = list(scores)
    by: dict[str, list[UttScore]] = defaultdict(list)
    for s in scores:
        by[s.condition].append(s)

    def acc(xs: list[UttScore]) -> float | None:  # None: scored by transcripts alone
        f = sum(s.frames for s in xs)
        return sum(s.correct for s in xs) / f if f else None

    def per(xs: list[UttScore], speech_only: bool = False) -> float:
        n = sum(s.ref_speech if speech_only else s.ref_phones for s in xs)
        edits = sum(s.edits_speech if speech_only else s.edits for s in xs)
        return edits / n if n else 0.0

    conds = sorted(by)
    return {
        "frame_accuracy": acc(scores), "num_frames": sum(s.frames for s in scores),
        "num_utterances": len(scores), "per": per(scores), "per_speech": per(scores, True),
        "ref_phones": sum(s.ref_phones for s in scores),
        "per_condition": {c: acc(by[c]) for c in conds},
        "per_condition_per": {c: per(by[c]) for c in conds},
        "per_condition_per_speech": {c: per(by[c], True) for c in conds},
        "per_condition_frames": {c: sum(s.frames for s in by[c]) for c in conds},
        "per_condition_utterances": {c: len(by[c]) for c in conds},
    }


def relative_error_reduction(base: dict[str, float], new: dict[str, float]) -> dict[str, float]:
    out = {}
    for c in sorted(set(base) & set(new)):
        eb, en = 1.0 - base[c], 1.0 - new[c]
        out[c] = (eb - en) / eb if eb > 0 else 0.0
    return out


# ----------------------------------------------------------------- featurising a corpus
@dataclasses.dataclass
class EvalUtt:
    utt_id: str
    condition: str
    feats: np.ndarray  # [rows, D] normalised
    labels: np.ndarray | None  # [rows] class ids; None: scored by `words` alone
    words: list[list[tuple[int, ...]]] | None = None  # per word its variants' phone ids


def _phone_ids(phones: Sequence[str]) -> tuple[dict[str, int], int]:
    ids = {p: i for i, p in enumerate(phones)}
    return ids, ids.get(al.UNK, -1)


def load_split(st: Storage, corpus: str, split: str, fcfg: FeaturesConfig,
               phones: Sequence[str], norm: Normalizer, audio: str = "stored",
               frame_labels: dict[str, np.ndarray] | None = None,
               prons: dict[str, list[tuple[str, ...]]] | None = None
               ) -> tuple[list[EvalUtt], list[Reject], int, str]:
    """Featurise the corpus records of `split` (audio: stored, or clean = the dry
    renderings): (utterances, rejects, records in, reference). The reference: "align"
    (`frame_labels`, `amflow align`'s per-frame classes) when they cover a record of the
    split or no lexicon is given, else "ctm" (the corpus CTM's phones) when the corpus has
    one, else "transcript": the records' words through the lexicon `prons`, scored by PER
    alone (`phones` are the phone names the reference ids index)."""
    # the input format's split rule: a record without `split` is labeled when aligned
    recs, rejects = records_of_split(st, corpus, split)
    n_in = len(recs) + len(rejects)
    if audio == "clean":
        recs = clean_renderings(st, corpus, recs, rejects)
    if frame_labels is not None and (prons is None or any(r.utt_id in frame_labels
                                                          for r in recs)):
        return (_load_aligned(st, corpus, recs, rejects, fcfg, norm, frame_labels), rejects,
                n_in, "align")
    ctm_uri = join(corpus, "alignments.ctm")
    if not st.exists(ctm_uri):
        if prons is None:
            raise StepError(f"{ctm_uri} not found and no lexicon: evaluation needs frame "
                            "references (the CTM, or `amflow align` of the split) or the "
                            "transcripts with a lexicon (data.lexicon)")
        return (_load_transcribed(st, corpus, recs, rejects, fcfg, norm, phones, prons),
                rejects, n_in, "transcript")
    aligns, ctm_errors = al.read_ctm(st.read_text(ctm_uri))
    bad_ctm = {utt: msg for _, utt, msg in ctm_errors}
    ids, unk = _phone_ids(phones)

    def aligned(r) -> bool:
        if r.utt_id in aligns:
            return True
        rejects.append(Reject(r.utt_id, "missing_alignment",
                              bad_ctm.get(r.utt_id, "no lines in alignments.ctm")))
        return False

    computer = FbankComputer(fcfg)
    out: list[EvalUtt] = []
    prog = Progress(len(recs), desc="evaluate features", unit="utts", interval_s=10)
    for r, wave, x in featurize_records(st, corpus, recs, fcfg, computer, rejects,
                                        accept=aligned, on_speaker=prog.update):
        a = aligns[r.utt_id]
        pid = np.array([ids.get(p, unk) for p in a.phones], dtype=np.int64)
        if (pid < 0).any():
            missing = sorted({p for p, i in zip(a.phones, pid) if i < 0})
            rejects.append(Reject(r.utt_id, "unknown_phone",
                                  f"phones not in the model's inventory: {missing[:5]}"))
            continue
        n100 = computer.num_frames(len(wave))
        fl, reason, detail = al.frame_labels_ids(a.starts, a.ends, pid, n100, fcfg)
        if fl is None:
            rejects.append(Reject(r.utt_id, reason or "alignment_mismatch", detail))
            continue
        lab = al.lfr_labels(fl, x.shape[0], fcfg.stack, fcfg.subsample).astype(np.int64)
        out.append(EvalUtt(r.utt_id, r.condition or "unknown", norm(x).astype(np.float32), lab))
    prog.close()
    return out, rejects, n_in, "ctm"


def _load_aligned(st: Storage, corpus: str, recs: list[Any], rejects: list[Reject],
                  fcfg: FeaturesConfig, norm: Normalizer, frame_labels: dict[str, np.ndarray]
                  ) -> list[EvalUtt]:
    """load_split's utterances labelled from `amflow align` (features.labels=align)."""
    def aligned(r) -> bool:
        if r.utt_id in frame_labels:
            return True
        rejects.append(Reject(r.utt_id, "missing_alignment", "amflow align has no alignment "
                              "for it (align.splits must hold the split evaluated)"))
        return False

    computer = FbankComputer(fcfg)
    out: list[EvalUtt] = []
    for r, wave, x in featurize_records(st, corpus, recs, fcfg, computer, rejects,
                                        accept=aligned):
        fl, detail = fit_frames(frame_labels[r.utt_id], computer.num_frames(len(wave)),
                                fcfg.label_frame_tolerance)
        if fl is None:
            rejects.append(Reject(r.utt_id, "alignment_mismatch", detail))
            continue
        lab = al.lfr_labels(fl, x.shape[0], fcfg.stack, fcfg.subsample).astype(np.int64)
        out.append(EvalUtt(r.utt_id, r.condition or "unknown", norm(x).astype(np.float32), lab))
    return out


def _load_transcribed(st: Storage, corpus: str, recs: list[Any], rejects: list[Reject],
                      fcfg: FeaturesConfig, norm: Normalizer, phones: Sequence[str],
                      prons: dict[str, list[tuple[str, ...]]]) -> list[EvalUtt]:
    """load_split's utterances with their transcripts' pronunciations as the reference (no
    frame labels): a record without words, with a word not in the lexicon or a phone not
    in the model's inventory is a reject."""
    ids = {p: i for i, p in enumerate(phones)}
    words: dict[str, list[list[tuple[int, ...]]]] = {}

    def transcribed(r) -> bool:
        said = words_of(r.text or "")
        oov = sorted({w for w in said if w not in prons})
        unknown = sorted({p for w in said if w in prons for v in prons[w] for p in v
                          if p not in ids})
        if not said:
            rejects.append(Reject(r.utt_id, "no_transcript", "the record has no words"))
        elif oov:
            rejects.append(Reject(r.utt_id, "oov_word", f"not in the lexicon: {oov[:10]}"))
        elif unknown:
            rejects.append(Reject(r.utt_id, "unknown_phone",
                                  f"phones not in the model's inventory: {unknown[:5]}"))
        else:
            words[r.utt_id] = [[tuple(ids[p] for p in v) for v in prons[w]] for w in said]
            return True
        return False

    computer = FbankComputer(fcfg)
    out: list[EvalUtt] = []
    for r, _, x in featurize_records(st, corpus, recs, fcfg, computer, rejects,
                                     accept=transcribed):
        out.append(EvalUtt(r.utt_id, r.condition or "unknown", norm(x).astype(np.float32),
                           None, words[r.utt_id]))
    return out


def clean_renderings(st: Any, corpus: str, recs: list[Any], rejects: list[Reject]
                     ) -> list[Any]:
    """The records with their dry (close-talk) rendering as audio, condition "dry"
    (evaluate.audio=clean); a record without `clean_audio_uri` is a reject."""
    clean = load_clean_sources(st, corpus)
    out = []
    for r in recs:
        src = clean.get(r.utt_id)
        if src is None:
            rejects.append(Reject(r.utt_id, "no_clean_audio",
                                  "evaluate.audio=clean: the record has no clean_audio_uri"))
        else:
            out.append(dataclasses.replace(r, audio_uri=src["uri"], condition="dry"))
    if not out:
        raise StepError(f"evaluate.audio=clean: no record of this split in {corpus} has a "
                        "clean_audio_uri (synthesise with corpus.clean_splits including it)")
    return out


# ----------------------------------------------------------------- running a model
@torch.no_grad()
def predict(model: torch.nn.Module, utts: Sequence[EvalUtt], batch_frames: int = 20000,
            device: str = "cpu") -> list[np.ndarray]:
    """Argmax class per row for each utterance (in input order), length-sorted batches."""
    model = model.to(device).eval()
    order = sorted(range(len(utts)), key=lambda i: len(utts[i].feats))
    preds: list[np.ndarray | None] = [None] * len(utts)
    batch: list[int] = []

    def run(b: list[int]) -> None:
        lens = torch.tensor([len(utts[i].feats) for i in b])
        x = torch.zeros(len(b), int(lens.max()), utts[b[0]].feats.shape[1])
        for j, i in enumerate(b):
            x[j, :lens[j]] = torch.from_numpy(utts[i].feats)
        y = model(x.to(device), lens).argmax(-1).cpu().numpy()
        for j, i in enumerate(b):
            preds[i] = y[j, :int(lens[j])]

    for i in order:
        n = len(utts[i].feats)
        if batch and n * (len(batch) + 1) > batch_frames:
            run(batch)
            batch = []
        batch.append(i)
    if batch:
        run(batch)
    return preds  # type: ignore[return-value]


def evaluate_model(model: torch.nn.Module, utts: Sequence[EvalUtt], batch_frames: int = 20000,
                   device: str = "cpu", silence: int = -1,
                   to_phone: np.ndarray | None = None,
                   phone_refs: bool = False) -> dict[str, Any]:
    """Scores over the model's classes; with `phone_refs` the references are phones (the
    corpus CTM's) and each predicted class is first mapped to its phone by `to_phone`."""
    preds = predict(model, utts, batch_frames, device)
    if phone_refs and to_phone is not None:
        preds = [to_phone[p] for p in preds]
        to_phone = None
    return aggregate(score_utterance(p, u.labels, u.condition, silence, to_phone)
                     if u.labels is not None else
                     score_transcript(p if to_phone is None else to_phone[p], u.words or [],
                                      u.condition, silence)
                     for p, u in zip(preds, utts))


# ----------------------------------------------------------------- a model on a split
def features_config(card: ModelCard, fallback: FeaturesConfig) -> FeaturesConfig:
    """The features config the model was trained on (stored in its file), else `fallback`."""
    return dataclass_from_dict(FeaturesConfig, card.features) if card.features else fallback


@dataclasses.dataclass
class Evaluation:
    """The result JSON of one evaluation and what went into it."""

    result: dict[str, Any]
    rejects: list[Reject]
    records_in: int
    scored: int


def evaluate_split(st: Storage, model: torch.nn.Module, card: ModelCard, model_uri: str,
                   cmvn: dict[str, Any], phones: Sequence[str], corpus: str, split: str,
                   ecfg: EvaluateConfig, fallback_features: FeaturesConfig,
                   frame_labels: dict[str, np.ndarray] | None = None,
                   prons: dict[str, list[tuple[str, ...]]] | None = None,
                   baseline_bytes: bytes | None = None) -> Evaluation:
    """Score `model` (its metadata: `card`; CMVN and phones resolved by the caller) on the
    corpus split, with `evaluate.baseline` beside it when set. A model whose classes are a
    network tree's leaves (card.context) is scored against `amflow align`'s classes when
    `frame_labels` cover the split, else against phones (each predicted leaf read as its
    phone: the same reference as a phone-class model's): the corpus CTM's, or without one
    the transcripts' through the lexicon `prons` (PER only; `frame_accuracy` None).
    `baseline_bytes`: the baseline's model file, if the caller read it already."""
    fcfg = features_config(card, fallback_features)
    norm = Normalizer.from_stats(cmvn, model.input_dim)
    utts, rejects, n_in, reference = load_split(
        st, corpus, split, fcfg, card.base_phones if card.context else phones, norm,
        ecfg.audio, frame_labels if card.context else None, prons)
    if not utts:
        raise StepError(nothing_left(f"evaluate (split '{split}')", n_in,
                                     (r.reason for r in rejects), ""))
    dim = utts[0].feats.shape[1]
    if dim != model.input_dim:
        raise StepError(f"features have {dim} dims, the model expects {model.input_dim}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    silence, to_phone = _phone_map(card, phones)
    phone_refs = reference != "align"
    result = evaluate_model(model, utts, ecfg.batch_frames, device, silence, to_phone,
                            phone_refs)
    result["reference"] = reference
    reasons: dict[str, int] = {}
    for r in rejects:
        reasons[r.reason] = reasons.get(r.reason, 0) + 1
    result.update({"model": model_uri, "model_kind": card.kind, "data": corpus,
                   "split": split, "rejected": reasons,
                   "train_info": {k: v for k, v in card.info.items()
                                  if k not in ("metrics", "context")}})
    if ecfg.baseline:
        base_model, base_card = card_from_bytes(
            baseline_bytes if baseline_bytes is not None else st.read_bytes(ecfg.baseline),
            ecfg.baseline)
        if base_card.phones and list(base_card.phones) != list(phones):
            raise StepError("evaluate.baseline has a different phone inventory than --model")
        base = evaluate_model(base_model, utts, ecfg.batch_frames, device, silence, to_phone,
                              phone_refs)
        base["model"] = ecfg.baseline
        result["baseline"] = base
        if result["frame_accuracy"] is not None:  # none by transcripts alone
            result["rel_frame_error_reduction"] = relative_error_reduction(
                {**base["per_condition"], "all": base["frame_accuracy"]},
                {**result["per_condition"], "all": result["frame_accuracy"]})
    return Evaluation(result, rejects, n_in, len(utts))


def labels_in_model_classes(model_tree: dict[str, Any], align_tree: ContextTree,
                            labels: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """`amflow align`'s frame labels (the leaves of `align_tree`) in the classes of a model
    whose card carries `model_tree`: as they are when it is the same tree, each read as
    its phone when it is that tree's phone tree (train.grow's phone stage, or a run aligned
    at one class per phone), else None: the leaves of another tree do not say which of
    the model's classes is right (the caller scores by PER against the transcripts)."""
    mine = ContextTree.from_dict(model_tree)
    if mine == align_tree:
        return labels
    if mine == align_tree.phone_tree():
        center = align_tree.leaf_center
        return {u: center[np.asarray(lab, np.int64)].astype(np.int16)
                for u, lab in labels.items()}
    log.warning("the model's network tree (%d leaves) is not the one align labelled this "
                "run with (%d): scored by PER against the transcripts", mine.num_leaves,
                align_tree.num_leaves)
    return None


def _phone_map(card: ModelCard, phones: Sequence[str]) -> tuple[int, np.ndarray | None]:
    """(silence id, class -> phone id map or None) for PER: phone classes score as they
    are; context-dependent ones through their tree's leaf -> phone map."""
    if not card.context:
        return (list(phones).index(SIL) if SIL in phones else -1), None
    base = card.base_phones  # the tree's center_phones
    return (base.index(SIL) if SIL in base else -1), ContextTree.from_dict(card.context).leaf_center


def print_table(result: dict[str, Any]) -> None:
    """The per-condition table of a result, on stdout ("-": no frame reference)."""
    def pct(v: float | None, width: int) -> str:
        return f"{'-':>{width}}" if v is None else f"{100 * v:>{width}.2f}"

    lines = [f"{'condition':<10} {'frames':>8} {'frame acc %':>12} {'PER %':>8} "
             f"{'PER-sil %':>10}"]
    for c, a in result["per_condition"].items():
        lines.append(f"{c:<10} {result['per_condition_frames'][c]:>8} {pct(a, 12)} "
                     f"{pct(result['per_condition_per'][c], 8)} "
                     f"{pct(result['per_condition_per_speech'][c], 10)}")
    lines.append(f"{'all':<10} {result['num_frames']:>8} {pct(result['frame_accuracy'], 12)} "
                 f"{pct(result['per'], 8)} {pct(result['per_speech'], 10)}")
    if result.get("reference") == "transcript":
        lines.append("(no frame reference: PER against the transcripts' pronunciations)")
    print("\n".join(lines), flush=True)
