"""Pronunciation lexicon: words -> phone sequences in the acoustic model's phone inventory.

    Lexicon                      word -> list of pronunciations (tuples of phones)
    read_lexicon(text) / Lexicon.to_text()
                                 Kaldi `lexicon.txt`: `word p1 p2 ...`, one line per
                                 pronunciation variant; `#` comments and blank lines skipped
    words_of(text) -> [word]     the words of a transcript as the lexicon and LM spell them
                                 (lower case, punctuation dropped, apostrophes kept)
    espeak_lexicon(groups)       a lexicon from what espeak-ng said (`said_groups`)
    said_groups(sentence, language) -> [(words, phones)]
                                 one espeak-ng synthesis split at its word events
    can_produce(lexicon, words, phones) -> bool
                                 does some choice of variants spell exactly `phones`?
    coverage(lexicon, utterances) -> dict
                                 the share of (words, phones) pairs the lexicon produces, OOVs

Shared by the corpus generator and the decoder, so it lives here below both (tasks/ must
not import decoding/); `decoding.lexicon` re-exports it.

Why word events and contexts: espeak-ng's phones for a word depend on its neighbours
(vowel reduction of "the" and "a", flapping across word boundaries, linking), and it
speaks some word pairs as one group ("on the" has one word event). The lexicon is
therefore built from the words as espeak-ng says them in running sentences, not from
words said alone: every group of one word adds a variant; a group of several words is
split where all but one of its words take a known variant, the last one gets the rest.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from tasks.speech import espeak
from tasks.speech import text as T

# Letters (any alphabet's, so `été` stays one word: a-z alone split it into fragments)
# and digits, with single inner apostrophes; on ASCII text the same as [a-z0-9]+('...)*.
_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)*")
SIL = "sil"


def words_of(text: str) -> list[str]:
    return _WORD.findall(text.lower())


@dataclass
class Lexicon:
    prons: dict[str, list[tuple[str, ...]]] = field(default_factory=dict)

    def add(self, word: str, phones: Sequence[str]) -> bool:
        """Add a variant; False if it was there already or is empty."""
        p = tuple(phones)
        if not p:
            return False
        variants = self.prons.setdefault(word, [])
        if p in variants:
            return False
        variants.append(p)
        return True

    def __contains__(self, word: str) -> bool:
        return word in self.prons

    def __len__(self) -> int:
        return len(self.prons)

    @property
    def num_prons(self) -> int:
        return sum(len(v) for v in self.prons.values())

    def phones(self) -> set[str]:
        return {p for vs in self.prons.values() for v in vs for p in v}

    def to_text(self) -> str:
        return "".join(f"{w} {' '.join(v)}\n" for w in sorted(self.prons)
                       for v in sorted(self.prons[w]))  # one text per lexicon, any build order


class LexiconError(ValueError):
    pass


def read_lexicon(text: str) -> Lexicon:
    """Kaldi lexicon.txt; a line with a word and no phones is an error naming the line."""
    lex = Lexicon()
    for lineno, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        parts = s.split()
        if len(parts) < 2:
            raise LexiconError(f"lexicon line {lineno}: '{s}' has a word but no phones")
        lex.add(parts[0].lower(), parts[1:])
    if not lex.prons:
        raise LexiconError("the lexicon has no entries")
    return lex


# ----------------------------------------------------------------- from espeak-ng
def said_groups(sentence: str, voice=None) -> list[tuple[list[str], list[str]]]:
    """espeak-ng says `sentence`: (text words, phones) for each of its word events.

    `voice` (espeak.VoiceParams, default en-us): the speaking rate and the variant decide
    whether some linking phones (";") get any duration at all, so a lexicon is built from
    several voices."""
    syn = espeak.synthesize(sentence, voice or espeak.VoiceParams(), seed=0)
    events = syn.word_phones()
    starts = [m.start() for m in re.finditer(r"\S+", sentence)]
    tokens = sentence.split()
    groups: list[tuple[list[str], list[str]]] = []
    for k, (pos, _, phones) in enumerate(events):
        end = events[k + 1][0] if k + 1 < len(events) else len(sentence)
        words = [w for s, tok in zip(starts, tokens) if pos <= s < end for w in words_of(tok)]
        if words:
            groups.append((words, phones))
        elif groups:  # an event inside a token (o'clock): its phones belong to that word
            groups[-1][1].extend(phones)
    return groups


def _split(lex: Lexicon, words: list[str], phones: tuple[str, ...]) -> list[tuple[str, ...]] | None:
    """Pieces of `phones`, one per word, each a known variant; None if there is none."""
    if not words:
        return [] if not phones else None
    for v in lex.prons.get(words[0], []):
        if phones[:len(v)] == v:
            rest = _split(lex, words[1:], phones[len(v):])
            if rest is not None:
                return [v, *rest]
    return None


def _split_one_new(lex: Lexicon, words: list[str], phones: tuple[str, ...]) -> bool:
    """Learn one new variant from a group: every other word takes a known variant."""
    for j in range(len(words)):
        for head in _prefixes(lex, words[:j], phones):
            for tail_len in _suffix_lengths(lex, words[j + 1:], phones[len(head):]):
                piece = phones[len(head):len(phones) - tail_len]
                if piece:
                    return lex.add(words[j], piece)
    return False


def _prefixes(lex: Lexicon, words: list[str], phones: tuple[str, ...]) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = [()]
    for w in words:
        out = [h + v for h in out for v in lex.prons.get(w, []) if phones[len(h):len(h) + len(v)] == v]
    return out


def _suffix_lengths(lex: Lexicon, words: list[str], phones: tuple[str, ...]) -> list[int]:
    rev = Lexicon({w: [tuple(reversed(v)) for v in lex.prons.get(w, [])] for w in words})
    return [len(h) for h in _prefixes(rev, list(reversed(words)), tuple(reversed(phones)))]


def espeak_lexicon(groups: Iterable[tuple[list[str], list[str]]]) -> tuple[Lexicon, int]:
    """A lexicon from said groups; also the number of groups no split could explain."""
    lex = Lexicon()
    multi: list[tuple[list[str], tuple[str, ...]]] = []
    for words, phones in groups:
        if len(words) == 1:
            lex.add(words[0], phones)
        elif phones:
            multi.append((words, tuple(phones)))
    pending = multi
    for _ in range(3):  # a variant learnt from one group can explain another
        left = [(w, p) for w, p in pending if _split(lex, w, p) is None
                and not _split_one_new(lex, w, p)]
        if len(left) == len(pending):
            break
        pending = left
    unexplained = sum(1 for w, p in pending if _split(lex, w, p) is None)
    add_linking_variants(lex)
    return lex, unexplained


def linking_rules(lex: Lexicon, min_words: int = 3) -> set[tuple[str, str]]:
    """(last phone, linking phone) pairs: espeak-ng appends the linking phone to a word
    ending in that phone when the next word starts with a vowel ("story ;", "far r-"),
    and drops it again when the speaker leaves a gap between words. A pair counts when
    at least `min_words` words show it (a variant with and one without)."""
    seen: dict[tuple[str, str], int] = {}
    for variants in lex.prons.values():
        have = set(variants)
        pairs = {(v[-2], v[-1]) for v in variants if len(v) > 1 and v[:-1] in have}
        for pair in pairs:
            seen[pair] = seen.get(pair, 0) + 1
    return {pair for pair, n in seen.items() if n >= min_words}


def add_linking_variants(lex: Lexicon) -> int:
    """Give every word the variants the linking rules allow; returns how many were added."""
    rules = linking_rules(lex)
    linking = {x for _, x in rules}
    added = 0
    for word, variants in lex.prons.items():
        for v in list(variants):
            for last, x in rules:
                if v[-1] == last:
                    added += lex.add(word, v + (x,))
            if len(v) > 1 and v[-1] in linking and (v[-2], v[-1]) in rules:
                added += lex.add(word, v[:-1])
    return added


# ----------------------------------------------------------------- checks
def can_produce(lex: Lexicon, words: Sequence[str], phones: Sequence[str]) -> bool:
    """True when variants of `words`, in order, spell `phones` (silence removed)."""
    target = tuple(p for p in phones if p != SIL)
    reach = {0}
    for w in words:
        variants = lex.prons.get(w)
        if not variants:
            return False
        reach = {i + len(v) for i in reach for v in variants if target[i:i + len(v)] == v}
        if not reach:
            return False
    return len(target) in reach


def coverage(lex: Lexicon, utterances: Iterable[tuple[list[str], Sequence[str]]]) -> dict:
    """How many (words, aligned phones) pairs the lexicon produces; OOV words counted."""
    n = ok = 0
    oov: Counter = Counter()
    tokens = 0
    for words, phones in utterances:
        n += 1
        tokens += len(words)
        missing = [w for w in words if w not in lex]
        oov.update(missing)
        ok += bool(not missing and can_produce(lex, words, phones))
    return {"utterances": n, "produced": ok, "share": ok / n if n else 0.0,
            "oov_tokens": sum(oov.values()), "oov_rate": sum(oov.values()) / tokens if tokens else 0.0,
            "oov_words": dict(oov.most_common(20))}


# ----------------------------------------------------------------- the embedded vocabulary
LEXICON_SENTENCES = 1500
LEXICON_VERSION = 2  # bump when the way the lexicon is built changes (cache key)
_T_LEXICON = 0x4C58  # a text-generator key no corpus utterance uses


def espeak_requests(language: str = "en-us", sentences: int = LEXICON_SENTENCES,
                    variants: Sequence[str] = ("",)) -> list[tuple[str, object]]:
    """(text, voice) pairs to build the embedded vocabulary's lexicon from: every word
    alone, then running sentences from the text generator said by voices that cycle
    through the variants, the corpus's rates (135-205 wpm) and word gaps (a gap between
    words drops espeak-ng's linking phones). Independent of the corpus seed, so every
    corpus of the generator gets the same lexicon."""
    base = espeak.VoiceParams(language=language)
    out: list[tuple[str, object]] = [(w, base) for w in T.vocabulary()]
    for i in range(sentences):
        words = int(np.random.default_rng([_T_LEXICON, i]).integers(3, 15))
        voice = espeak.VoiceParams(language=language, variant=variants[i % len(variants)],
                                   rate=135 + (i * 7) % 71, word_gap=(0, 1, 0, 2)[i % 4])
        out.append((T.sentence_for(0, _T_LEXICON, i, target_words=words), voice))
    return out


def said_groups_many(requests: Sequence[tuple[str, object]]) -> list[tuple[list[str], list[str]]]:
    return [g for text, voice in requests for g in said_groups(text, voice)]
