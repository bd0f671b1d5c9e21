"""Transcripts -> the words amflow spells: one declared rule per locale (`ingest.locale`).

    rule_for(locale) -> Rule            the rule of the locale's language (en, fr, de, es,
                                        it, pt); a ValueError for one without a rule
    normalize(text, rule) -> Normalized the normalized text, or the reject reason and the
                                        characters or numbers the rule cannot make words of
    normalize_entries(parsed, rule)     every transcribed entry normalized in place (the
                                        original kept as `text_original`), or moved to the
                                        rejects: nothing is changed silently

The rule, in order (docs/how-to/import.md#transcripts shows it with examples):

1. Unicode NFKC: compatibility forms become the plain ones (full-width `Ｈｅｌｌｏ` ->
   `Hello`, the ligature `ﬁ` -> `fi`, `①` -> `1`), composed accents stay composed.
2. Lower case.
3. Accents: a letter of the locale's alphabet is kept as it is (`é` in French); a letter
   outside it is folded to its base letter(s) when those are in the alphabet (`séven` ->
   `seven` in English, `Dvořák` -> `dvorak` in German; `æ` `œ` `ø` `ß` `ł` `ð` `þ` by a
   small table), and is otherwise untranscribable (Cyrillic, CJK, ...).
4. Punctuation (Unicode category P) separates words and is removed, except the marks
   said as words (`%` `‰` `#` `&` `@` `*` `/` `\\` `§` `¶` `†` `‡`) and the brackets of
   event markers (`[noise]`, `{breath}`: read as words they would teach `noise` as
   speech), which are untranscribable (see 6), and a mark between two digits (`3.5`,
   `1,000`, `2:30`: part of the number, see 5). An apostrophe (`'`, `’`, `‘`, `ʼ`,
   `` ` ``) between two letters is kept, as `'` (`don't`, `l'homme`); at a word's edge it
   is removed (`'quoted'` -> `quoted`). A hyphen or dash is punctuation: the words it
   joins become separate words (`e-mail` -> `e mail`, `twenty-one` -> `twenty one`), each
   a word said in turn. Invisible format characters (soft hyphen, zero-width space) are
   removed.
5. Digits: English spells out the numbers whose reading the text fixes, 0..99 and the
   ordinals 1st..99th (`42` -> `forty two`, `21st` -> `twenty first`); any other token
   with a digit (years, 100 and up, leading zeros, `3.5`, `2:30`, `x2`) is an
   `unreadable_number` reject, because whether `1999` was said "nineteen ninety nine" or
   "one thousand nine hundred ninety nine", or `101` "one oh one", the text cannot say,
   and a wrong guess teaches the model words the speaker did not say. Locales other than
   English have no spelling rule: every digit is `unreadable_number`.
6. Anything else (symbols and emoji: `🙂`, `$`, `+`, `=`, `°`, and the marks in 4;
   control characters; letters the rule cannot fold) is an `untranscribable_text` reject
   naming each character: it is either said as a word the text does not hold (`%`
   "percent") or not speech at all, and dropping it silently would hide that.

Every word of the output matches `tasks.speech.lexicon.words_of` whole (letters and
digits, single inner apostrophes), so the lexicon, the LM and the tokenizers see the
same words, never fragments of one.
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Callable

from tasks.importers.entries import Parsed

ASCII = "abcdefghijklmnopqrstuvwxyz"
APOSTROPHES = "'\u2019\u2018\u02bc`"
# Punctuation that is said as a word ("percent", "and", "at", "slash"...), and the square
# and curly brackets of Kaldi's event markers ([noise], {breath}: not words that were
# said): untranscribable, never dropped.
SPOKEN_MARKS = "%\u2030\u2031#&@*/\\\u00a7\u00b6\u2020\u2021[]{}"
DIGITS = "0123456789"
# Letters NFD does not split into a base letter and an accent.
FOLD = {"æ": "ae", "œ": "oe", "ø": "o", "ß": "ss", "ł": "l", "đ": "d", "ð": "d", "þ": "th",
        "ı": "i", "ħ": "h", "ŧ": "t", "ŋ": "n"}
_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
         "fourteen fifteen sixteen seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_ORDINAL_ONES = {"one": "first", "two": "second", "three": "third", "five": "fifth",
                 "eight": "eighth", "nine": "ninth", "twelve": "twelfth"}
_EN_NUMBER = re.compile(r"(0|[1-9][0-9]?)(st|nd|rd|th)?")


def english_number(token: str) -> list[str] | None:
    """`42` -> [forty, two], `21st` -> [twenty, first]; None when the token is not a
    number 0..99 (or an ordinal 1st..99th with its right suffix)."""
    m = _EN_NUMBER.fullmatch(token)
    if m is None:
        return None
    n, suffix = int(m.group(1)), m.group(2)
    words = [_ONES[n]] if n < 20 else [_TENS[n // 10]] + ([_ONES[n % 10]] if n % 10 else [])
    if suffix is None:
        return words
    want = "th" if n % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    if n == 0 or suffix != want:
        return None
    last = words[-1]
    words[-1] = _ORDINAL_ONES.get(last) or (last[:-1] + "ieth" if last.endswith("y")
                                            else last + "th")
    return words


@dataclass(frozen=True)
class Rule:
    language: str
    letters: str  # the locale's alphabet, lower case: kept as they are
    spell_number: Callable[[str], list[str] | None] | None = None  # None: digits rejected

    def describe(self) -> str:
        extra = "".join(c for c in self.letters if c not in ASCII)
        return f"{self.language} (a-z{extra and ' ' + extra})"


RULES = {
    "en": Rule("en", ASCII, english_number),
    "fr": Rule("fr", ASCII + "àâæçéèêëîïôœùûüÿ"),
    "de": Rule("de", ASCII + "äöüß"),
    "es": Rule("es", ASCII + "áéíñóúü"),
    "it": Rule("it", ASCII + "àèéìíîòóù"),
    "pt": Rule("pt", ASCII + "áâãàçéêíóôõú"),
}


def rule_for(locale: str) -> Rule:
    """The rule of a locale's language subtag (`en-US`, `en_GB`, `fr` ...)."""
    language = re.split(r"[-_]", locale.strip().lower(), 1)[0]
    if language not in RULES:
        raise ValueError(f"no transcript rule for language {language!r} (locale {locale!r}); "
                         f"rules exist for {', '.join(sorted(RULES))} "
                         f"(tasks/importers/text_normalize.py RULES)")
    return RULES[language]


@dataclass
class Normalized:
    text: str  # the words, space-separated ("" when rejected or when nothing was left)
    reason: str = ""  # "" or the reject reason: untranscribable_text | unreadable_number
    detail: str = ""


def _fold(ch: str, rule: Rule) -> str | None:
    """A letter outside the alphabet -> its base letters in it, or None."""
    base = "".join(c for c in unicodedata.normalize("NFD", ch)
                   if not unicodedata.category(c).startswith("M"))
    base = "".join(FOLD.get(c, c) for c in base)
    return base if base and all(c in rule.letters for c in base) else None


def _char(ch: str, rule: Rule, in_number: bool) -> str | None:
    """What one (NFKC, lower-cased) character becomes: itself or folded letters, `'`,
    " " (a word separator), "" (removed), or None (untranscribable). `in_number`: the
    character stands between two digits (`3.5`, `1,000`, `2:30`): kept, so the number
    stays one token (which the digit rule then reads or rejects whole)."""
    if ch in rule.letters or ch in DIGITS:
        return ch
    if ch in APOSTROPHES:
        return "'"
    if ch.isspace():
        return " "
    cat = unicodedata.category(ch)
    if cat.startswith("P") and ch not in SPOKEN_MARKS:
        return ch if in_number else " "
    if (cat == "Cf" and ch != "\u200d") or cat in ("Mn", "Me"):
        # Invisible formatting, and accents NFKC could not join to their letter (the
        # letter's own fold decides); a zero-width joiner belongs to an emoji sequence.
        return ""
    return _fold(ch, rule) if cat.startswith("L") else None


def _describe(ch: str) -> str:
    name = unicodedata.name(ch, "")
    return f"{ch!r} (U+{ord(ch):04X}{' ' + name if name else ''})"


def normalize(text: str, rule: Rule) -> Normalized:
    """One transcript by the rule (module docstring); never a fragment of a word."""
    out, bad = [], []
    s = unicodedata.normalize("NFKC", text).lower()
    for i, ch in enumerate(s):
        between_digits = 0 < i < len(s) - 1 and s[i - 1] in DIGITS and s[i + 1] in DIGITS
        got = _char(ch, rule, between_digits)
        if got is None:
            bad.append(ch)
        else:
            out.append(got)
    if bad:
        chars = ", ".join(_describe(c) for c in dict.fromkeys(bad))
        return Normalized("", "untranscribable_text", (
            f"{chars} in {text!r:.80}: neither a letter of the {rule.describe()} alphabet, "
            f"a digit, nor punctuation the rule removes; write it as it was said (`%` as "
            f"percent), or remove it if it was not speech"))
    words, numbers = [], []
    # A run of two or more apostrophes separates, as words_of reads it.
    for token in re.split(r"\s+|'{2,}", "".join(out)):
        token = token.strip("'")
        if not token:
            continue
        if not any(c.isdigit() for c in token):
            words.append(token)
            continue
        spelled = rule.spell_number(token) if rule.spell_number else None
        if spelled is None:
            numbers.append(token)
        else:
            words.extend(spelled)
    if numbers:
        how = ("spells out 0..99 and 1st..99th only" if rule.spell_number
               else "spells out no numbers")
        return Normalized("", "unreadable_number", (
            f"{' '.join(dict.fromkeys(numbers))} in {text!r:.80}: the {rule.language} rule "
            f"{how}; write the number in words as it was said"))
    return Normalized(" ".join(words))


def normalize_entries(parsed: Parsed, rule: Rule) -> None:
    """Each transcribed entry's text by the rule, the original kept as `text_original`
    where it differs; an entry the rule cannot make words of, or with no words left, is
    moved to the rejects (so items in = entries + rejects still holds)."""
    kept = []
    for e in parsed.entries:
        if e.text is None:
            kept.append(e)
            continue
        got = normalize(e.text, rule)
        if got.reason:
            parsed.reject(e.utt_id, got.reason, got.detail)
        elif not got.text:
            parsed.reject(e.utt_id, "empty_text", f"no words in {e.text!r:.80} (punctuation "
                          f"only)")
        else:
            if got.text != e.text:
                e.text_original = e.text
            e.text = got.text
            kept.append(e)
    parsed.entries = kept
