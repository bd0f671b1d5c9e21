"""Pronunciations for words a lexicon lacks, from espeak-ng (the project's G2P).

    pronounce(words, phone_set, language) -> (made {word: phones}, failed {word: why})

Each word is said alone by espeak-ng (as the embedded lexicon's first pass says every
word of the generator's vocabulary, tasks/speech/lexicon.py) and its phones are mapped to
the lexicon's phone set (phone_sets.py: espeak-ng's own mnemonics, or ARPAbet in the
lexicon's case and stress convention). A word whose phones cannot be mapped, or that
espeak-ng says nothing for, is `failed` with the reason: never a silent gap.
"""
from __future__ import annotations

import logging
from typing import Iterable

from core.progress import Progress
from tasks.speech import espeak
from tasks.speech.lexicon import said_groups
from tasks.speech.phone_sets import PhoneSet

log = logging.getLogger(__name__)


def espeak_phones(word: str, language: str) -> list[str]:
    """What espeak-ng says for `word` alone (every word event's phones, in order: a
    number can be several words)."""
    return [p for _, phones in said_groups(word, espeak.VoiceParams(language=language))
            for p in phones]


def pronounce(words: Iterable[str], phone_set: PhoneSet, language: str = "en-us"
              ) -> tuple[dict[str, list[str]], dict[str, str]]:
    words = sorted(set(words))
    made: dict[str, list[str]] = {}
    failed: dict[str, str] = {}
    with Progress(len(words), "g2p", unit="words") as bar:
        for w in words:
            try:
                phones, why = phone_set.from_espeak(espeak_phones(w, language))
            except (espeak.EspeakError, OSError) as exc:
                phones, why = None, f"espeak-ng failed: {exc}"
            if phones is None:
                failed[w] = why
            else:
                made[w] = phones
            bar.update(1)
    log.info("g2p: %d of %d words pronounced by espeak-ng (%s), %d failed", len(made),
             len(words), phone_set.kind, len(failed))
    return made, failed
