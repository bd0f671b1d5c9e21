"""Deterministic English sentences from an embedded vocabulary.

    sentence(rng, target_words) -> str
        One sentence (a voice-assistant request, a statement or a question) whose word
        count is as close to `target_words` as the grammar allows (3..14 words).
    sentence_for(seed, *key, target_words) -> str
        The same from a seed and a key (speaker, utterance number, ...): equal inputs
        give equal sentences on every machine (numpy's SeedSequence, no global state).
    estimate_seconds(text, rate_wpm) -> float
        espeak-ng speaking time, from syllables, words and pauses (calibrated on
        espeak-ng en-us, within ~7 % on average), so that a corpus can be planned to a
        number of hours before anything is synthesised.
    syllables(word) -> int

The vocabulary is plain, regular English written for this module: nouns with their
plurals, verbs in base and past forms, adjectives, adverbs, names, places, numbers.
"""
from __future__ import annotations

import bisect
import re
from typing import Callable, Sequence

import numpy as np

DETERMINERS = ["the", "a", "this", "that", "my", "your", "our", "one", "every", "her", "his"]

ADJECTIVES = """small large quiet bright old new green red blue yellow warm cold heavy light
quick slow happy careful wooden silver golden empty busy gentle strange simple early late
loud soft sharp round narrow wide hidden famous clever honest friendly sleepy hungry tired
dusty muddy shiny broken fresh frozen tall short young ancient distant nearby purple orange
pale dark sweet bitter calm brave curious lucky lonely noisy polite proud rapid rich rough
salty smooth spicy sticky tiny gray pink plastic paper cotton woolen electric""".split()

# singular: plural (plural omitted = regular, see _plural)
NOUNS = """dog cat river mountain window garden kitchen teacher doctor farmer table chair
letter bottle engine bridge city village forest island ocean painting camera radio guitar
piano ticket basket blanket bicycle candle lamp pencil notebook jacket umbrella morning
evening package machine computer telephone student neighbor captain pilot driver market
station library museum hospital office harbor meadow valley desert tower castle cottage
kettle sandwich apple lemon carrot cookie mirror pillow rabbit horse turtle eagle dolphin
monkey elephant tiger spider butterfly storm cloud rainbow shadow story song question answer
problem puzzle recipe message signal number picture journey holiday birthday festival
meeting lesson violin drum hammer ladder bucket rope wagon boat train plane truck garage
balloon feather flower tree leaf:leaves stone shell coin key:keys door:doors box:boxes
glass:glasses dish:dishes brush:brushes fox:foxes bench:benches watch:watches
party:parties baby:babies family:families country:countries berry:berries
penny:pennies cherry:cherries puppy:puppies lady:ladies knife:knives wolf:wolves
child:children mouse:mice goose:geese tooth:teeth foot:feet""".split()

# base: past
VERBS_TRANSITIVE = """find:found paint:painted carry:carried open:opened close:closed
clean:cleaned move:moved fix:fixed watch:watched buy:bought sell:sold borrow:borrowed
notice:noticed pack:packed wrap:wrapped lift:lifted drop:dropped follow:followed
visit:visited build:built describe:described remember:remembered count:counted
measure:measured order:ordered deliver:delivered collect:collected repair:repaired
wash:washed check:checked bring:brought catch:caught draw:drew hide:hid keep:kept
push:pushed pull:pulled share:shared test:tested throw:threw touch:touched
feed:fed cook:cooked read:read mail:mailed water:watered sketch:sketched
photograph:photographed""".split()

VERBS_INTRANSITIVE = """wait:waited laugh:laughed smile:smiled sleep:slept arrive:arrived
leave:left dance:danced whisper:whispered listen:listened shout:shouted wander:wandered
rest:rested return:returned disappear:disappeared stay:stayed sing:sang run:ran
swim:swam travel:traveled work:worked cry:cried jump:jumped walk:walked""".split()

ADVERBS = """quietly slowly quickly carefully suddenly happily early yesterday again together
outside upstairs downstairs today tonight twice gently loudly proudly finally usually
almost rarely eagerly calmly""".split()

PREPOSITIONS = """near behind under beside inside above across along around past before
after without with beyond between toward""".split()

NAMES = """Anna Peter Maria James Lucy Daniel Sarah Thomas Emma Oliver Grace Henry Olivia
Samuel Chloe Victor Nora Felix Ruby Oscar Alice Leo Hannah Jack Irene Martin Julia Simon
Clara Hugo Laura Adam Helen Robert Diana Walter""".split()

CITIES = """Boston Denver Seattle Chicago Austin Portland Phoenix Atlanta Dallas Miami
Houston Detroit Memphis Nashville Orlando Tucson Omaha Madison Richmond Raleigh London
Paris Berlin Madrid Rome Vienna Dublin Oslo Tokyo Sydney""".split()

ROOMS = ["kitchen", "bedroom", "living room", "hallway", "garage", "office", "bathroom",
         "dining room", "basement", "attic", "nursery", "porch"]

DEVICES = ["lights", "fan", "heater", "radio", "television", "oven", "lamp", "speaker",
           "air conditioner", "coffee maker", "dishwasher", "porch light"]

GENRES = ["jazz", "classical", "rock", "country", "piano", "folk", "dance", "blues",
          "reggae", "gospel", "opera", "soul"]

TIMES = ["this morning", "last night", "on Monday", "on Friday evening", "at noon",
         "in the spring", "after dinner", "before breakfast", "next week", "on Sunday",
         "last summer", "in the afternoon", "at midnight", "on Tuesday", "later today"]

NUMBERS = """one two three four five six seven eight nine ten eleven twelve thirteen
fourteen fifteen sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty""".split()


def _pairs(items: list[str]) -> list[tuple[str, str]]:
    out = []
    for it in items:
        a, _, b = it.partition(":")
        out.append((a, b or ""))
    return out


def _plural(noun: str) -> str:
    if noun.endswith(("s", "x", "ch", "sh")):
        return noun + "es"
    if noun.endswith("y") and noun[-2:-1] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


_NOUNS = [(s, p or _plural(s)) for s, p in _pairs(NOUNS)]
_VT = _pairs(VERBS_TRANSITIVE)
_VI = _pairs(VERBS_INTRANSITIVE)


class _Gen:
    """Random picks for one sentence."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def pick(self, seq: Sequence[str]) -> str:
        return seq[int(self.rng.integers(len(seq)))]

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def noun(self) -> str:
        return _NOUNS[int(self.rng.integers(len(_NOUNS)))][0]

    def plural(self) -> str:
        return _NOUNS[int(self.rng.integers(len(_NOUNS)))][1]

    def np(self, adj: float = 0.5) -> str:
        det = self.pick(DETERMINERS)
        words = [self.pick(ADJECTIVES)] if self.chance(adj) else []
        if words and self.chance(adj * 0.3):
            words.insert(0, self.pick(ADJECTIVES))
        noun = self.noun()
        if det == "a" and (words[0] if words else noun)[0] in "aeiou":
            det = "an"
        return " ".join([det, *words, noun])

    def pp(self) -> str:
        return f"{self.pick(PREPOSITIONS)} {self.np(0.4)}"

    def vt(self) -> tuple[str, str]:
        return _VT[int(self.rng.integers(len(_VT)))]

    def vi(self) -> tuple[str, str]:
        return _VI[int(self.rng.integers(len(_VI)))]

    def subject(self) -> str:
        return self.pick(NAMES) if self.chance(0.4) else self.np()


def _statement(g: _Gen) -> str:
    parts = [g.subject()]
    if g.chance(0.6):
        parts += [g.vt()[1], g.np()]
    else:
        parts.append(g.vi()[1])
    if g.chance(0.5):
        parts.append(g.pp())
    if g.chance(0.3) or len(" ".join(parts).split()) < MIN_WORDS:
        parts.append(g.pick(ADVERBS))
    if g.chance(0.35):
        return f"{g.pick(TIMES).capitalize()}, " + " ".join(parts) + "."
    return " ".join(parts) + "."


def _question(g: _Gen) -> str:
    kind = int(g.rng.integers(4))
    if kind == 0:
        return f"How many {g.plural()} did {g.subject()} {g.vt()[0]} {g.pick(TIMES)}?"
    if kind == 1:
        return f"Where did {g.pick(NAMES)} {g.vt()[0]} {g.np()}?"
    if kind == 2:
        return f"Why is {g.np()} {g.pick(PREPOSITIONS)} {g.np(0.2)}?"
    return f"Did {g.subject()} {g.vi()[0]} {g.pp()}?"


_CLOCK = ["o'clock", "thirty", "fifteen", "in the evening"]


def _command(g: _Gen) -> str:
    kind = int(g.rng.integers(10))
    if kind == 0:
        return (f"Turn {g.pick(['on', 'off'])} the {g.pick(DEVICES)} in the "
                f"{g.pick(ROOMS)}.")
    if kind == 1:
        return f"Set a timer for {g.pick(NUMBERS)} minutes."
    if kind == 2:
        return f"Play some {g.pick(GENRES)} music in the {g.pick(ROOMS)}."
    if kind == 3:
        return f"What is the weather in {g.pick(CITIES)} {g.pick(['today', 'tomorrow', 'tonight', 'this weekend'])}?"
    if kind == 4:
        return f"Call {g.pick(NAMES)} {g.pick(['at home', 'on the mobile', 'at work', 'now'])}."
    if kind == 5:
        return f"Add {g.pick(NUMBERS[1:10])} {g.plural()} to my shopping list."
    if kind == 6:
        return (f"Remind me to {g.vt()[0]} {g.np(0.3)} at {g.pick(NUMBERS[:12])} "
                f"{g.pick(_CLOCK)}.")
    if kind == 7:
        return f"How far is {g.pick(CITIES)} from {g.pick(CITIES)}?"
    if kind == 8:
        return f"Read me a story about {g.np(0.8)} {g.pp()}."
    return f"Dim the {g.pick(DEVICES[:2])} in the {g.pick(ROOMS)} to {g.pick(NUMBERS[9:])} percent."


_KINDS: list[tuple[float, Callable[[_Gen], str]]] = [(0.5, _statement), (0.2, _question),
                                                     (0.3, _command)]


# Words the templates themselves say (besides the vocabulary lists above).
TEMPLATE_WORDS = """how many did where why is turn on off in the set a timer for minutes play
some music what weather today tomorrow tonight this weekend call at home mobile work now add
to my shopping list remind me o'clock thirty fifteen evening far from read story about dim
percent an""".split()


def vocabulary() -> list[str]:
    """Every word a generated sentence can contain (lower case, sorted)."""
    words = set(TEMPLATE_WORDS)
    for group in (DETERMINERS, ADJECTIVES, ADVERBS, PREPOSITIONS, NAMES, CITIES, ROOMS,
                  DEVICES, GENRES, TIMES, NUMBERS):
        for item in group:
            words.update(item.split())
    for a, b in _NOUNS + _VT + _VI:
        words.update((a, b))
    return sorted(w.lower() for w in words)


_KIND_CUM = list(np.cumsum([w for w, _ in _KINDS]) / sum(w for w, _ in _KINDS))
MIN_WORDS = 3


def word_count(text: str) -> int:
    return len(text.split())


def sentence(rng: np.random.Generator, target_words: int, tries: int = 8) -> str:
    """A sentence with a word count close to `target_words` (best of `tries` drafts)."""
    g = _Gen(rng)
    best, best_err = "", None
    for _ in range(tries):
        kind = _KINDS[min(bisect.bisect_right(_KIND_CUM, float(rng.random())), len(_KINDS) - 1)][1]
        s = kind(g)
        s = s[0].upper() + s[1:]
        n = word_count(s)
        err = abs(n - target_words) + (100 if n < MIN_WORDS else 0)
        if best_err is None or err < best_err:
            best, best_err = s, err
        if err == 0:
            break
    return best


def sentence_for(seed: int, *key: int, target_words: int) -> str:
    """sentence() from a seed and an integer key, e.g. (speaker index, utterance number)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed & 0xFFFFFFFF, *key]))
    return sentence(rng, target_words)


_VOWEL_GROUPS = re.compile(r"[aeiouy]+")


def syllables(word: str) -> int:
    """A rough English syllable count (vowel groups, silent final e)."""
    w = re.sub(r"[^a-z]", "", word.lower())
    if not w:
        return 0
    n = len(_VOWEL_GROUPS.findall(w))
    if w.endswith("e") and not w.endswith(("le", "ee", "ye")) and n > 1:
        n -= 1
    return max(n, 1)


# Fitted on espeak-ng 1.51 en-us at 175 wpm over sentences from this module (see
# tests/test_speech.py::test_estimate_seconds_tracks_espeak).
_SEC_PER_SYLLABLE = 0.088
_SEC_PER_WORD = 0.142
_SEC_PER_PAUSE = 0.40
_SEC_FIXED = 0.087


def estimate_seconds(text: str, rate_wpm: int = 175, word_gap: int = 0) -> float:
    """Expected espeak-ng speaking time of `text` (no leading/trailing padding)."""
    words = text.split()
    syl = sum(syllables(w) for w in words)
    pauses = sum(text.count(p) for p in ",;:")
    speech = _SEC_PER_SYLLABLE * syl + _SEC_PER_WORD * len(words)
    return (speech * 175.0 / rate_wpm + _SEC_PER_PAUSE * pauses + _SEC_FIXED
            + 0.01 * word_gap * max(len(words) - 1, 0))
