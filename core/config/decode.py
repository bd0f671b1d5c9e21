"""Scoring models: `evaluate.*`, `lm.*`, `decode.*`, `report.*`."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from core.config.errors import check

@dataclass
class EvaluateConfig:
    baseline: str = ""  # optional model URI to compare against
    # Output dir `evaluate` (empty tag) or `evaluate-<tag>`; the default --model is then
    # this run's `train[-<tag>]/model.pt`.
    tag: str = ""
    batch_frames: int = 20000  # frames per forward batch of the model
    # Which rendering to score: stored (the record's audio_uri) or clean (its dry,
    # close-talk `clean_audio_uri`, condition "dry"; records without one are rejects).
    audio: str = "stored"

    def validate(self, key: str) -> None:
        check(self.audio in ("stored", "clean"), f"{key}.audio", "must be stored or clean")


@dataclass
class LmConfig:
    """`amflow lm`: a word n-gram with interpolated Kneser-Ney smoothing (decoding/lm.py)."""

    order: int = 3  # n of the word n-gram
    # The embedded default trains on sentences drawn from the corpus text generator with
    # a seed no audio uses (never on dev/test transcripts).
    sentences: int = 100_000
    seed: int = 20261123  # seeds the generator sentences
    # Also estimate from this corpus split's transcripts (e.g. labeled); empty = none
    # (with lm.source corpus or both: labeled).
    text_split: str = ""
    source: str = "auto"  # the LM's text: auto (generator for the embedded corpus, corpus for any other) | generator (lm.sentences of the text generator) | corpus (the corpus's transcripts, lm.text_split or labeled, + lm.text_file) | both
    text_file: str = ""  # URI of a text of your own, one sentence per line, added to the LM's text (any lm.source)
    # Highest-order n-grams seen fewer times are pruned (their mass backs off): a 3-gram
    # of 100k generator sentences has 356k trigrams, 2/3 of them seen once; cut at 2 the
    # decoding graph is ~3x smaller at a small perplexity cost (see the lm step's metrics).
    min_count: int = 2

    def validate(self, key: str) -> None:
        check(1 <= self.order <= 5, f"{key}.order", "must be in [1, 5]")
        check(self.min_count >= 1, f"{key}.min_count", "must be >= 1")
        check(self.sentences >= 0, f"{key}.sentences", "must be >= 0")
        check(self.text_split in ("", "labeled", "unlabeled"), f"{key}.text_split",
               "must be empty, labeled or unlabeled (never dev or test)")
        check(self.source in ("auto", "generator", "corpus", "both"), f"{key}.source",
              "must be auto, generator, corpus or both")
        check(self.sentences > 0 or bool(self.text_split) or bool(self.text_file)
              or self.source != "generator", f"{key}.sentences",
              "must be > 0 when lm.source=generator and lm.text_split and lm.text_file are "
              "empty (no text to estimate from)")


CHUNKING = r"(full|[1-9][0-9]*x(-1|[0-9]+))?"
FULL_CHUNK = 1_000_000  # "full": one chunk longer than any utterance


def chunking_of(value: str) -> tuple[int, int] | None:
    """decode.chunking as (chunk rows, left chunks); None for "" (the model's own)."""
    if not value:
        return None
    if value == "full":
        return FULL_CHUNK, -1
    chunk, left = value.split("x")
    return int(chunk), int(left)


@dataclass
class DecodeConfig:
    """`amflow decode`: WFST decoding to words and WER (decoding/decode.py)."""

    # ARPA LM URI; empty = this run's `amflow lm` output (decode refuses, naming that
    # command, when it is missing).
    lm: str = ""
    # Output dir `decode` (empty tag) or `decode-<tag>`; default --model as for evaluate.
    tag: str = ""
    # Acoustic scales tried on the tuning split (the LM weight is its inverse); the best
    # one is applied to the scored split.
    acwt: list[float] = field(default_factory=lambda: [0.2, 0.3, 0.4, 0.5, 0.7])
    tune_split: str = "dev"  # empty = no tuning: decode.acwt's first value
    # In graph-cost units (LM plus acwt-scaled acoustic costs). On the demo's baseline at
    # acwt 0.3 (dev): beam 13 WER 28.3 % at 27x real time per core, 10: 28.9 % at 71x,
    # 8 (max_active 1000): 29.7 % at 154x; `amflow bench decode` prints 10 beside 8.
    beam: float = 10.0
    max_active: int = 2000  # most active states per frame of the search
    sil_prob: float = 0.5  # probability of optional silence between words in the lexicon graph
    # Ray actors that featurise, run the model and search (each one CPU).
    workers: int = 2
    batch_frames: int = 20000  # frames per forward batch of the model
    # A CTC model (train.model ctc): tlg searches T o L o G (CTC topology, the tokens'
    # spelling of each word, the LM; decoding/ctc_graph.py), greedy takes the best token
    # per frame (no lexicon or LM).
    # rescore (a joint CTC/attention model, model.ctc.attention_weight > 0): the CTC prefix
    # beam's decode.ctc_nbest best rescored by the attention decoder (no LM).
    ctc_search: str = "tlg"
    # tlg: how T reads a token repeated on consecutive frames. standard: one token (CTC's
    # own reading, the one the model trained with: a doubled letter needs a blank between),
    # the graph the export ships to sherpa-onnx, whose search then gives decode's words.
    # compact: also two tokens (k2's compact topology; decode's before 2026-12-07). On the
    # demo's CTC SSL student, dev 19.89 % standard vs 19.82 % compact; sherpa-onnx's words
    # = decode's on 364/364 test utterances with standard, 344/364 with compact.
    ctc_topology: str = "standard"
    # true: decode only the frames `amflow serve`'s speech gate keeps (serve.speech_*,
    # tasks/speech_activity.py): no words from silence, a constant signal or steady noise,
    # as served. false (default): every frame, the WER every recorded decode measured.
    speech_gate: bool = False
    ctc_nbest: int = 8  # rescore: the prefix beam's width and n-best
    # A streaming Conformer's attention chunks in decode, serve and export, its weights unchanged
    # (U2's dynamic chunk training lets one model decode with any): "" the model's own
    # (model.conformer.chunk and left_chunks at training), "CxL" chunks of C rows (C - 1 rows
    # of look-ahead) with L chunks of left context (-1: every earlier row), "full" each
    # utterance whole (decode only: nothing to stream). Other families refuse a value.
    chunking: str = ""
    # tlg: LM weights (the acoustic scale is their inverse) and blank penalties (subtracted
    # from the blank's log-probability) tried on decode.tune_split, every pair; the best
    # pair scores the split.
    # (The embedded corpus's CTC baseline, dev: flat within 1 point over lm 1.6-3.0 x blank
    # 3-5; docs/results/2026-11-29-ctc-baseline.md.)
    ctc_lm_weights: list[float] = field(default_factory=lambda: [0.8, 1.2, 1.6, 2.4])
    blank_penalties: list[float] = field(default_factory=lambda: [0.0, 1.5, 3.0, 4.5])  # tlg, greedy: subtracted from the blank's log-probability per frame; tried with each LM weight (greedy: alone) on decode.tune_split

    def validate(self, key: str) -> None:
        check(self.ctc_search in ("tlg", "greedy", "rescore"), f"{key}.ctc_search",
              "must be tlg, greedy or rescore")
        check(self.ctc_topology in ("standard", "compact"), f"{key}.ctc_topology",
              "must be standard or compact")
        check(self.ctc_nbest >= 1, f"{key}.ctc_nbest", "must be >= 1")
        check(re.fullmatch(CHUNKING, self.chunking) is not None, f"{key}.chunking",
              f"must be empty, full, or CxL (chunk rows >= 1 x left chunks >= -1, e.g. 4x8), "
              f"got {self.chunking!r}")
        check(bool(self.ctc_lm_weights) and all(w > 0 for w in self.ctc_lm_weights),
              f"{key}.ctc_lm_weights", "must be a non-empty list of weights > 0")
        check(bool(self.blank_penalties), f"{key}.blank_penalties", "must be a non-empty list")
        check(bool(self.acwt) and all(a > 0 for a in self.acwt), f"{key}.acwt",
               "must be a non-empty list of scales > 0")
        check(self.tune_split in ("", "dev", "labeled"), f"{key}.tune_split",
               "must be empty, dev or labeled (never test)")
        check(self.beam > 0, f"{key}.beam", "must be > 0")
        check(self.max_active >= 10, f"{key}.max_active", "must be >= 10")
        check(0 < self.sil_prob < 1, f"{key}.sil_prob", "must be in (0, 1)")
        check(self.workers >= 1, f"{key}.workers", "must be >= 1")
        check("/" not in self.tag, f"{key}.tag", "must not contain '/'")


@dataclass
class ReportConfig:
    """`amflow report`: which runs and evaluations the report compares."""

    teacher_run: str = ""  # run holding the teacher and the baseline; empty = this run
    teacher_eval: str = ""  # URIs; empty = the conventional places under the runs
    baseline_eval: str = ""  # the baseline's evaluate result; empty: its conventional place
    ssl_eval: str = ""  # the SSL student's evaluate result; empty: its conventional place
