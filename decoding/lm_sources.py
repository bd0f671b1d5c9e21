"""What `amflow lm` estimates from, and whether the LM fits the corpus's speech.

Text sources (`lm.source`):
    generator  lm.sentences sentences of the embedded corpus's text generator (lm.seed),
               plus the transcripts of lm.text_split when set
    corpus     the corpus's transcripts of lm.text_split (default labeled), plus the
               lines of lm.text_file when set: a user's corpus, the user's words
    both       the two together
    auto       generator for the corpus `amflow corpus` made (its text is the
               generator's), corpus for any other (an import, a corpus of your own):
               an LM of the generator's 738 words does not fit a user's speech (a dev
               perplexity of 59,196 and 6x the WER on one user's isolated words)
lm.text_file (any source): one sentence per line, words split and cased as transcripts.

Fit (`fit_warnings`): a dev/test perplexity above the vocabulary size (worse than
guessing every word uniformly) or an OOV rate above OOV_WARN says the LM's text is not the
speech's; `amflow lm` logs each as a WARNING with the keys that change the text.
"""
from __future__ import annotations

import logging

from core.config import ConfigError, LmConfig
from core.outcomes import SUCCESS
from core.storage import join
from decoding.lexicon import words_of
from decoding.lm import generator_sentences, split_transcripts

log = logging.getLogger(__name__)

EMBEDDED = "amflow corpus"  # the generator of the embedded corpus's _SUCCESS.json
OOV_WARN = 0.05  # dev/test OOV rate above which the LM's vocabulary misses the speech's


def embedded_corpus(storage, corpus: str) -> bool:
    """Whether `amflow corpus` made the corpus (its text is the generator's)."""
    try:
        return storage.read_json(join(corpus, SUCCESS)).get("generator") == EMBEDDED
    except (FileNotFoundError, ValueError, OSError, AttributeError):
        return False


def text_source(storage, lc: LmConfig, corpus: str) -> str:
    """generator | corpus | both: lm.source with auto resolved for this corpus."""
    if lc.source != "auto":
        return lc.source
    return "generator" if embedded_corpus(storage, corpus) else "corpus"


def file_sentences(storage, uri: str) -> list[list[str]]:
    try:
        text = storage.read_text(uri)
    except FileNotFoundError:
        raise ConfigError("lm.text_file", f"file not found: {uri}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError("lm.text_file", f"{uri}: not UTF-8 text ({exc})") from None
    return [w for w in (words_of(line) for line in text.splitlines()) if w]


def lm_text(storage, lc: LmConfig, corpus: str, records=None) -> tuple[list[list[str]], dict]:
    """The LM's training sentences and where they came from ({source, generator,
    <split>, text_file}: sentences each). `records`: a callable giving the corpus's."""
    source = text_source(storage, lc, corpus)
    made: dict = {"source": source}
    text: list[list[str]] = []
    if source in ("generator", "both") and lc.sentences:
        text += generator_sentences(lc.sentences, lc.seed)
        made["generator"] = lc.sentences
    split = lc.text_split or ("labeled" if source in ("corpus", "both") else "")
    if split:
        sents = split_transcripts(storage, corpus, split, records() if records else None)
        text += sents
        made[f"transcripts_{split}"] = len(sents)
    if lc.text_file:
        sents = file_sentences(storage, lc.text_file)
        text += sents
        made["text_file"] = len(sents)
    if not text:
        raise ConfigError("lm.source", f"no text to estimate the LM from ({made}): corpus "
                          f"{corpus} has no transcripts in split {split or '-'} "
                          f"(lm.text_split) and lm.text_file is empty; set lm.text_file, "
                          f"lm.text_split or lm.source=generator")
    return text, made


def fit_warnings(metrics: dict, vocabulary: int, made: dict) -> list[str]:
    """The reasons the LM does not fit the dev/test speech, each logged as a WARNING."""
    out = []
    fix = ("estimate it from this corpus's text: lm.source=corpus (the labeled "
           "transcripts) and/or lm.text_file=<your sentences>" if made["source"] ==
           "generator" else "add text like the speech's: lm.text_file=<your sentences>, "
           "or words to the lexicon")
    for split in ("dev", "test"):
        m = metrics.get(split)
        if not m:
            continue
        if m["perplexity"] > vocabulary:
            out.append(f"lm: {split} perplexity {m['perplexity']:.0f} is above the vocabulary "
                       f"size ({vocabulary}): the LM predicts this speech worse than "
                       f"guessing words uniformly ({made}); {fix}")
        if m["oov_rate"] > OOV_WARN:
            out.append(f"lm: {split} OOV rate {100 * m['oov_rate']:.1f} % (over "
                       f"{100 * OOV_WARN:.0f} %): words of the {split} transcripts are not in "
                       f"the LM's vocabulary (the lexicon plus its text); those words can "
                       f"never be recognised; {fix}")
    for w in out:
        log.warning("%s", w)
    return out
