"""Which phone set a lexicon spells with, and espeak-ng's phones in it.

    detect(phones) -> PhoneSet      espeak (espeak-ng's mnemonics, as the embedded lexicon;
                                    case matters: T is "th", t is "t"), arpabet (CMUdict /
                                    TIMIT style; upper or lower case, with or without the
                                    stress digits 0 1 2 on vowels) or other
    PhoneSet.from_espeak(phones)    espeak-ng's phones for a word in this set (None: a
                                    phone it has no counterpart for)
    resolve_names(names, phones)    config phone names (align.closure_stops) matched to a
                                    lexicon's phones: exact, else by case (p -> P in
                                    upper-case ARPAbet); the ones that match nothing

ARPAbet has no stress in espeak-ng's phone events, so a lexicon with stress digits gets,
for each vowel, the digit that vowel carries most often in that lexicon (AH -> AH0, EY
-> EY1 ...): close enough to align with, and written where the user can review it.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable

ARPABET_VOWELS = {"AA", "AE", "AH", "AO", "AW", "AY", "EH", "ER", "EY", "IH", "IY", "OW",
                  "OY", "UH", "UW", "AX", "AXR", "IX", "UX"}
ARPABET_CONSONANTS = {"B", "CH", "D", "DH", "DX", "EL", "EM", "EN", "F", "G", "HH", "JH",
                      "K", "L", "M", "N", "NG", "NX", "P", "Q", "R", "S", "SH", "T", "TH",
                      "V", "W", "WH", "Y", "Z", "ZH", "SIL", "SPN"}
_STRESSED = re.compile(r"^([A-Za-z]+)([012])$")

# espeak-ng en-us mnemonics -> ARPAbet (a phone may become two: "A@" is AA R). Linking
# phones (";") become nothing; the flap and the glottal stop are T as CMUdict spells them.
ESPEAK_TO_ARPABET = {
    "@": "AH", "@2": "AH", "@5": "AH", "a#": "AH", "V": "AH", "3": "ER", "3:": "ER",
    "@L": "AH L", "A:": "AA", "A": "AA", "0": "AA", "A@": "AA R", "a": "AE", "aa": "AE",
    "E": "EH", "e": "EH", "e@": "EH R", "I": "IH", "I2": "IH", "I#": "IH", "i": "IY",
    "i:": "IY", "i@": "IH R", "i@3": "IH R", "O:": "AO", "O": "AO", "O@": "AO R",
    "o@": "AO R", "OI": "OY", "U": "UH", "U@": "UH R", "u:": "UW", "u": "UW", "aI": "AY",
    "aI@": "AY ER", "aI3": "AY ER", "aU": "AW", "aU@": "AW ER", "eI": "EY", "oU": "OW",
    "o": "OW",
    "b": "B", "d": "D", "f": "F", "g": "G", "h": "HH", "j": "Y", "k": "K", "l": "L",
    "m": "M", "n": "N", "N": "NG", "p": "P", "r": "R", "r-": "R", "s": "S", "t": "T",
    "v": "V", "w": "W", "z": "Z", "D": "DH", "T": "TH", "S": "SH", "Z": "ZH", "tS": "CH",
    "dZ": "JH", "t#": "T", "?": "T", "x": "K", "hw": "W", "n-": "AH N", "l-": "AH L",
    "m-": "AH M", ";": "",
}


@dataclass
class PhoneSet:
    kind: str  # espeak | arpabet | other
    phones: set[str]  # the lexicon's; empty: any (a lexicon made by G2P alone)
    upper: bool = True  # arpabet: spelt upper case
    stress: dict[str, str] = field(default_factory=dict)  # arpabet vowel -> its usual digit

    def from_espeak(self, phones: Iterable[str]) -> tuple[list[str] | None, str]:
        """espeak-ng phones -> this set's ((phones, "") or (None, why))."""
        phones = list(phones)
        if self.kind == "espeak":
            out = [p for p in phones if p != ";"]
        elif self.kind == "arpabet":
            out = []
            for p in phones:
                if p not in ESPEAK_TO_ARPABET:
                    return None, f"espeak-ng phone {p!r} has no ARPAbet counterpart"
                out += [self._arpabet(a) for a in ESPEAK_TO_ARPABET[p].split()]
        else:
            return None, "the lexicon's phones are neither espeak-ng's nor ARPAbet"
        missing = sorted({p for p in out if p not in self.phones}) if self.phones else []
        if not out:
            return None, "espeak-ng said no phones"
        if missing:
            return None, f"phones not in the lexicon: {' '.join(missing)}"
        return out, ""

    def _arpabet(self, base: str) -> str:
        if base in ARPABET_VOWELS and self.stress:
            base += self.stress.get(base, "1")
        return base if self.upper else base.lower()


def _base(phone: str) -> tuple[str, str]:
    m = _STRESSED.match(phone)
    return (m.group(1).upper(), m.group(2)) if m else (phone.upper(), "")


def detect(phones: Iterable[str], counts: Counter | None = None) -> PhoneSet:
    """The convention of a lexicon's phones (`counts`: how often each occurs, for the
    stress digits' most usual choice)."""
    phones = set(phones)
    counts = counts or Counter({p: 1 for p in phones})
    espeak_known = set(ESPEAK_TO_ARPABET) | {"sil"}
    arpa = [p for p in phones if _base(p)[0] in ARPABET_VOWELS | ARPABET_CONSONANTS]
    if phones and len(arpa) >= 0.9 * len(phones) and len(arpa) > len(phones & espeak_known):
        upper = sum(p.isupper() for p in arpa) >= sum(p.islower() for p in arpa)
        usual: dict[str, Counter] = {}
        for p in arpa:
            base, digit = _base(p)
            if digit:
                usual.setdefault(base, Counter())[digit] += counts[p]
        stress = {b: c.most_common(1)[0][0] for b, c in usual.items()}
        return PhoneSet("arpabet", phones, upper, stress)
    if phones and len(phones & espeak_known) >= 0.9 * len(phones):
        return PhoneSet("espeak", phones)
    return PhoneSet("other", phones)


def resolve_names(names: Iterable[str], phones: Iterable[str]) -> tuple[list[str], list[str]]:
    """(the lexicon's spelling of each config phone name that matches one, the names that
    match none): exact first, else the one phone equal to it ignoring case and stress."""
    phones = set(phones)
    by_fold: dict[str, list[str]] = {}
    for p in phones:
        by_fold.setdefault(_base(p)[0].lower(), []).append(p)
    found, missing = [], []
    for n in names:
        if n in phones:
            found.append(n)
        elif len(by_fold.get(n.lower(), [])) == 1:
            found.append(by_fold[n.lower()][0])
        else:
            missing.append(n)
    return found, missing
