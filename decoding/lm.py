"""Word n-gram language models: interpolated modified Kneser-Ney, ARPA, perplexity.

    estimate(sentences, order=3) -> NgramModel
        Interpolated Kneser-Ney with three discounts per order (Chen & Goodman's modified
        KN, the smoothing of SRILM's `-kndiscount -interpolate`): the highest order uses
        raw counts, lower orders continuation counts (the number of distinct words seen
        before an n-gram; raw counts for n-grams that start with <s>, which nothing
        precedes), unigrams are interpolated with the uniform distribution over the
        vocabulary (so every lexicon word has mass).
    NgramModel.to_arpa() -> str        ARPA text: log10 probabilities and back-off weights
    read_arpa(text) -> NgramModel      any ARPA file (a user's own LM)
    NgramModel.logprob(word, history)  log10 P(word | history) by ARPA back-off
    perplexity(model, sentences) -> dict
        perplexity over the in-vocabulary words plus </s>, OOV tokens counted and skipped
        (SRILM's convention), and the OOV rate.

Sentences are lists of words (`decoding.lexicon.words_of`). <s> and </s> are added here.
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from decoding.lexicon import read_lexicon, words_of
from tasks.select import read_records
from tasks.speech import text as T

BOS, EOS, UNK = "<s>", "</s>", "<unk>"
LOG10_ZERO = -99.0


@dataclass
class NgramModel:
    order: int
    # probs[n][(w1..wn)] = log10 p(wn | w1..wn-1); backoffs[n][(w1..wn)] = log10 bow
    probs: list[dict[tuple[str, ...], float]] = field(default_factory=list)
    backoffs: list[dict[tuple[str, ...], float]] = field(default_factory=list)

    def vocabulary(self) -> set[str]:
        return {g[0] for g in self.probs[1]} - {BOS, EOS}

    def num_ngrams(self) -> list[int]:
        return [len(self.probs[n]) for n in range(1, self.order + 1)]

    def logprob(self, word: str, history: Sequence[str]) -> float:
        """log10 P(word | history) with ARPA back-off; -inf for a word outside the LM."""
        hist = tuple(history[-(self.order - 1):]) if self.order > 1 else ()
        bow = 0.0
        while True:
            gram = hist + (word,)
            p = self.probs[len(gram)].get(gram)
            if p is not None:
                return bow + p
            if not hist:
                return -math.inf
            bow += self.backoffs[len(hist)].get(hist, 0.0)
            hist = hist[1:]

    def to_arpa(self) -> str:
        lines = ["", "\\data\\"]
        lines += [f"ngram {n}={len(self.probs[n])}" for n in range(1, self.order + 1)]
        for n in range(1, self.order + 1):
            lines += ["", f"\\{n}-grams:"]
            for gram in sorted(self.probs[n]):
                row = f"{self.probs[n][gram]:.6f}\t{' '.join(gram)}"
                if n < self.order and gram in self.backoffs[n]:
                    row += f"\t{self.backoffs[n][gram]:.6f}"
                lines.append(row)
        lines += ["", "\\end\\", ""]
        return "\n".join(lines)


class ArpaError(ValueError):
    pass


def read_arpa(text: str) -> NgramModel:
    counts: dict[int, int] = {}
    section = 0
    model: NgramModel | None = None
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("ngram ") and section == 0:
            n, c = line[6:].split("=")
            counts[int(n)] = int(c)
        elif line.startswith("\\") and line.endswith("-grams:"):
            section = int(line[1:].split("-")[0])
            if model is None:
                if not counts:
                    raise ArpaError("no \\data\\ header with ngram counts")
                order = max(counts)
                model = NgramModel(order, [{} for _ in range(order + 1)],
                                   [{} for _ in range(order + 1)])
        elif line == "\\end\\":
            break
        elif section and model is not None:
            parts = line.split()
            if len(parts) not in (section + 1, section + 2):
                raise ArpaError(f"line {lineno}: expected {section} words and a probability")
            try:
                prob = float(parts[0])
                gram = tuple(parts[1:section + 1])
                model.probs[section][gram] = prob
                if len(parts) == section + 2:
                    model.backoffs[section][gram] = float(parts[-1])
            except ValueError:
                raise ArpaError(f"line {lineno}: not a number: {line[:60]}") from None
    if model is None or not model.probs[1]:
        raise ArpaError("no n-grams found")
    return model


# ----------------------------------------------------------------- estimation
def _kn_counts(sentences: Iterable[Sequence[str]], order: int) -> tuple[list[Counter], set[str]]:
    """counts[n]: the counts KN uses at order n (see the module docstring)."""
    counts: list[Counter] = [Counter() for _ in range(order + 1)]
    vocab: set[str] = set()
    for words in sentences:
        vocab.update(words)
        seq = [BOS, *words, EOS]
        for i in range(1, len(seq)):
            gram = tuple(seq[max(0, i - order + 1):i + 1])
            counts[len(gram)][gram] += 1  # shorter than `order` only when it starts with <s>
    for n in range(order - 1, 0, -1):
        # continuation count: distinct words seen before the n-gram (<s> included)
        counts[n].update(g[1:] for g in counts[n + 1])
    return counts, vocab


def _discounts(counts: Iterable[int]) -> tuple[float, float, float]:
    """Modified KN discounts D1, D2, D3+ from the counts-of-counts (Chen & Goodman)."""
    coc = Counter(c for c in counts if c <= 4)
    n1, n2, n3, n4 = (coc.get(k, 0) for k in (1, 2, 3, 4))
    if not (n1 and n2 and n3 and n4):
        return 0.5, 1.0, 1.5  # too little data for the estimate (tiny corpora, tests)
    y = n1 / (n1 + 2 * n2)
    d = (1 - 2 * y * n2 / n1, 2 - 3 * y * n3 / n2, 3 - 4 * y * n4 / n3)
    return tuple(min(max(x, 0.01), k + 1.0) for k, x in enumerate(d))  # type: ignore


def _order_probs(counts: Counter, lower: dict[tuple[str, ...], float],
                 uniform: float) -> tuple[dict[tuple[str, ...], float], dict[tuple[str, ...], float]]:
    """Interpolated probabilities of one order and the interpolation weight per history."""
    d = _discounts(counts.values())
    by_hist: dict[tuple[str, ...], list[tuple[str, int]]] = defaultdict(list)
    for gram, c in counts.items():
        by_hist[gram[:-1]].append((gram[-1], c))
    probs: dict[tuple[str, ...], float] = {}
    gammas: dict[tuple[str, ...], float] = {}
    for hist, items in by_hist.items():
        total = sum(c for _, c in items)
        kinds = Counter(min(c, 3) for _, c in items)
        gamma = (d[0] * kinds[1] + d[1] * kinds[2] + d[2] * kinds[3]) / total
        gammas[hist] = gamma
        for w, c in items:
            low = lower[hist[1:] + (w,)] if hist else uniform
            probs[hist + (w,)] = (c - d[min(c, 3) - 1]) / total + gamma * low
    return probs, gammas


def _log10(p: float) -> float:
    return math.log10(p) if p > 0 else LOG10_ZERO


def _prune(counts: Counter, probs: dict, lower: dict, gammas: dict, min_count: int
           ) -> tuple[dict, dict]:
    """Drop highest-order n-grams seen fewer than `min_count` times; the back-off weight
    of each history is recomputed so that its distribution still sums to one (the mass
    of a dropped n-gram goes to the lower order, SRILM's count cut-off)."""
    kept = {g: p for g, p in probs.items() if counts[g] >= min_count}
    mass: dict[tuple[str, ...], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for g, p in kept.items():
        m = mass[g[:-1]]
        m[0] += p
        m[1] += lower[g[1:]]
    bows = {}
    for h in gammas:
        hi, lo = mass.get(h, (0.0, 0.0))
        bows[h] = (1.0 - hi) / (1.0 - lo) if lo < 1.0 else gammas[h]
    return kept, bows


def estimate(sentences: Iterable[Sequence[str]], order: int = 3,
             vocabulary: Iterable[str] = (), min_count: int = 1) -> NgramModel:
    """Interpolated modified Kneser-Ney n-gram model (see the module docstring);
    highest-order n-grams seen fewer than `min_count` times are pruned."""
    if order < 1:
        raise ValueError("order must be >= 1")
    counts, vocab = _kn_counts(sentences, order)
    if not counts[1]:
        raise ValueError("no sentences to estimate an LM from")
    vocab = (vocab | set(vocabulary) | {EOS}) - {BOS}
    uniform = 1.0 / len(vocab)
    model = NgramModel(order, [{} for _ in range(order + 1)], [{} for _ in range(order + 1)])
    lower: dict[tuple[str, ...], float] = {}
    for n in range(1, order + 1):
        probs, gammas = _order_probs(counts[n], lower, uniform)
        if n == order > 1 and min_count > 1:
            probs, gammas = _prune(counts[n], probs, lower, gammas, min_count)
        if n == 1:  # words never seen get the uniform share of the unigram mass
            g = gammas.get((), 0.0)
            for w in vocab:
                probs.setdefault((w,), g * uniform)
            probs.pop((BOS,), None)
        model.probs[n] = {gram: _log10(p) for gram, p in probs.items()}
        if n > 1:  # the back-off weight of a history is its interpolation weight
            model.backoffs[n - 1] = {h: _log10(g) for h, g in gammas.items()}
        lower = probs
    model.probs[1][(BOS,)] = LOG10_ZERO
    return model


# ----------------------------------------------------------------- evaluation
def perplexity(model: NgramModel, sentences: Iterable[Sequence[str]]) -> dict:
    vocab = model.vocabulary()
    logp = 0.0
    scored = oov = tokens = 0
    for words in sentences:
        hist: list[str] = [BOS]
        for w in list(words) + [EOS]:
            if w != EOS:
                tokens += 1
            if w != EOS and w not in vocab:
                oov += 1
                hist = [BOS]  # SRILM: an OOV breaks the context
                continue
            logp += model.logprob(w, hist)
            scored += 1
            hist.append(w)
    ppl = 10 ** (-logp / scored) if scored else math.inf
    return {"perplexity": ppl, "tokens": tokens, "oov": oov,
            "oov_rate": oov / tokens if tokens else 0.0, "scored": scored}


# ----------------------------------------------------------------- `amflow lm`
_T_LM = 0x4C4D  # a text-generator key no corpus utterance uses ("LM")


def generator_sentences(count: int, seed: int) -> list[list[str]]:
    """`count` sentences of the corpus text generator under a key no audio uses, 3-14
    words like the corpus's, as word lists."""
    lengths = np.random.default_rng([seed & 0xFFFFFFFF, _T_LM]).integers(3, 15, size=count)
    return [words_of(T.sentence_for(seed, _T_LM, i, target_words=int(n)))
            for i, n in enumerate(lengths)]


def split_transcripts(storage, corpus: str, split: str, records=None) -> list[list[str]]:
    """The word sequences of one split; `records`: the corpus's, if already read."""
    if records is None:
        records, _, _ = read_records(storage, corpus)
    return [words_of(r.text) for r in records if r.split == split and r.text]


def lexicon_vocabulary(storage, lexicon_uri: str) -> set[str]:
    """The lexicon's words (every one gets unigram mass), or none without a lexicon."""
    return set(read_lexicon(storage.read_text(lexicon_uri)).prons) if storage.exists(lexicon_uri) else set()


def dev_test_metrics(storage, corpus: str, model: NgramModel, text: list[list[str]],
                     records=None) -> dict:
    """Perplexity, OOV rate and how often a sentence is in the LM text, on dev and test."""
    metrics: dict = {}
    seen = {" ".join(s) for s in text}
    has_corpus = storage.exists(corpus)
    for split in ("dev", "test"):
        sents = split_transcripts(storage, corpus, split, records() if records else None) \
            if has_corpus else []
        if sents:
            ppl = perplexity(model, sents)
            metrics[split] = {"perplexity": round(ppl["perplexity"], 3),
                              "oov_rate": ppl["oov_rate"], "sentences": len(sents),
                              # the generator's grammar repeats short commands: say how often
                              "seen_in_lm_text": sum(" ".join(s) in seen for s in sents) / len(sents)}
    return metrics
