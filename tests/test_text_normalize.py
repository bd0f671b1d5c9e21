"""Transcripts normalized by the ingest.locale rule at `amflow import`, never mangled:
per-rule unit tests, and an import whose records, rejects and lexicon show it."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from core.config import ConfigError, load_config
from core.storage import Storage
from tasks.importers import REASONS, import_corpus, read_kaldi
from tasks.importers.text_normalize import english_number, normalize, rule_for
from tasks.select import parse_metadata_line
from tasks.speech.lexicon import words_of

EN, FR, DE = rule_for("en-US"), rule_for("fr-FR"), rule_for("de")


def _text(text: str, rule=EN) -> str:
    got = normalize(text, rule)
    assert not got.reason, got
    return got.text


def _reject(text: str, rule=EN) -> tuple[str, str]:
    got = normalize(text, rule)
    assert got.text == "" and got.reason in REASONS, got
    return got.reason, got.detail


def test_nfkc_and_case():
    assert _text("Ｈｅｌｌｏ ＷＯＲＬＤ") == "hello world"  # full-width letters
    assert _text("ﬁne ﬂowers") == "fine flowers"  # ligatures
    assert _text("① and ２") == "one and two"  # compatibility digits, then spelled
    assert _text("HELLO") == "hello"


def test_accents_folded_where_the_alphabet_has_none_kept_where_it_has():
    assert _text("séven") == "seven"  # one word, not `s` `ven`
    assert _text("Café Dvořák Straße encyclopædia Øre") == \
        "cafe dvorak strasse encyclopaedia ore"
    assert _text("e\u0301te\u0301") == "ete"  # decomposed accents too
    assert _text("L'été à Noël, ça va?", FR) == "l'été à noël ça va"
    assert _text("Straße ÄRGER Dvořák", DE) == "straße ärger dvorak"  # ř is not German
    assert _text("Niño", rule_for("es")) == "niño"


def test_punctuation_apostrophes_and_hyphens():
    assert _text("Hello, World!") == "hello world"
    assert _text("don't") == "don't"
    assert _text("don’t DONʼT") == "don't don't"  # typographic apostrophes -> '
    assert _text("'quoted' rock 'n' roll") == "quoted rock n roll"  # edges removed
    assert _text("e-mail") == "e mail"  # a hyphen separates the words it joins
    assert _text("well—known; “yes” (no) «oui» ...") == "well known yes no oui"
    assert _text("co\u00adoperate") == "cooperate"  # soft hyphen: invisible, removed
    assert normalize("...", EN).text == "" and not normalize("...", EN).reason


def test_english_numbers_spelled_where_the_text_fixes_the_reading():
    assert english_number("0") == ["zero"]
    assert english_number("7") == ["seven"]
    assert english_number("13") == ["thirteen"]
    assert english_number("40") == ["forty"]
    assert english_number("42") == ["forty", "two"]
    assert english_number("99") == ["ninety", "nine"]
    assert english_number("1st") == ["first"] and english_number("2nd") == ["second"]
    assert english_number("12th") == ["twelfth"] and english_number("20th") == ["twentieth"]
    assert english_number("21st") == ["twenty", "first"]
    assert english_number("33rd") == ["thirty", "third"]
    for token in ("100", "1999", "07", "11st", "2th", "0th", "3.5", "x2"):
        assert english_number(token) is None, token
    assert _text("I saw 42 cats, the 21st time.") == \
        "i saw forty two cats the twenty first time"


@pytest.mark.parametrize("text, token", [
    ("in 1999", "1999"), ("3.5 apples", "3.5"), ("at 2:30", "2:30"), ("1,000 people", "1,000"),
    ("room 101", "101"), ("agent 007", "007"), ("x²", "x2"), ("1990–1999", "1990–1999")])
def test_numbers_the_text_cannot_fix_are_rejected(text, token):
    reason, detail = _reject(text)
    assert reason == "unreadable_number" and detail.startswith(token + " in ")


def test_other_locales_spell_no_numbers():
    reason, detail = _reject("3 chats", FR)
    assert reason == "unreadable_number" and "fr rule spells out no numbers" in detail


@pytest.mark.parametrize("text, named", [
    ("séven 🙂", "'🙂' (U+1F642 SLIGHTLY SMILING FACE)"),
    ("привет", "U+043F CYRILLIC SMALL LETTER PE"),
    ("10%", "U+0025 PERCENT SIGN"), ("A & B", "U+0026 AMPERSAND"),
    ("$5", "U+0024 DOLLAR SIGN"), ("and/or", "U+002F SOLIDUS"), ("ok 👍🏽", "U+1F3FD"),
    ("a\u200db", "ZERO WIDTH JOINER"), ("1 + 1", "PLUS SIGN"),
    ("hello [noise]", "LEFT SQUARE BRACKET"), ("{breath} hi", "LEFT CURLY BRACKET"),
    ("<unk>", "LESS-THAN SIGN")])
def test_what_the_rule_cannot_make_words_of_is_rejected_naming_it(text, named):
    reason, detail = _reject(text)
    assert reason == "untranscribable_text" and named in detail


def test_every_word_is_one_word_to_words_of():
    samples = ["séven", "Hello, World!", "don't", "e-mail", "L'été à Noël", "a''b 'c'",
               "Ｆｉｎｅ", "21st 42", "aujourd'hui"]
    for rule in (EN, FR):
        for text in samples:
            got = normalize(text, rule)
            if got.text:
                assert words_of(got.text) == got.text.split(), (text, got)
    assert words_of("l'été à noël") == ["l'été", "à", "noël"]  # not fragments
    assert words_of("Hello, world! don't") == ["hello", "world", "don't"]  # ASCII unchanged


def test_rule_for_locale():
    assert rule_for("en_GB") is EN and rule_for("EN") is EN and rule_for(" fr ") is FR
    with pytest.raises(ValueError, match="no transcript rule for language 'sw'.*en, es, fr"):
        rule_for("sw-KE")


TEXTS = {  # utt -> the transcript as given
    "emoji": "séven 🙂", "accent": "séven", "punct": "Hello, World!", "apos": "don't",
    "hyphen": "e-mail", "digits": "I saw 42 cats", "year": "in 1999",
    "nfkc": "Ｆｉｎｅ ﬁsh", "dots": "...", "plain": "hello",
}
WANT = {"accent": "seven", "punct": "hello world", "apos": "don't", "hyphen": "e mail",
        "digits": "i saw forty two cats", "nfkc": "fine fish", "plain": "hello"}


def _kaldi(root: Path) -> Path:
    d = root / "kaldi"
    d.mkdir(parents=True)
    for u in TEXTS:
        sf.write(root / f"{u}.wav", 0.1 * np.sin(np.arange(8000) / 5.0), 16000,
                 subtype="PCM_16")
    (d / "wav.scp").write_text("".join(f"{u} {root / u}.wav\n" for u in TEXTS))
    (d / "utt2spk").write_text("".join(f"{u} s\n" for u in TEXTS))
    (d / "text").write_text("".join(f"{u} {t}\n" for u, t in TEXTS.items()),
                            encoding="utf-8")
    return d


def _import(tmp_path: Path, *sets: str) -> dict:
    cfg = load_config(None, [f"storage.root={tmp_path / 'store'}", *sets])
    st = Storage(cfg.storage)
    return import_corpus(st, read_kaldi(st, str(_kaldi(tmp_path))), str(tmp_path / "corpus"),
                         cfg.ingest)


def test_import_normalizes_records_the_original_rejects_and_builds_the_lexicon(tmp_path):
    s = _import(tmp_path, "ingest.g2p=espeak")
    out = tmp_path / "corpus"
    recs = {}
    for line in (out / "metadata" / "split=labeled" / "labeled-part-00000.jsonl").read_text(
            encoding="utf-8").splitlines():
        parse_metadata_line(line)  # still the input format
        rec = json.loads(line)
        recs[rec["utt_id"]] = rec
    assert {u: r["text"] for u, r in recs.items()} == WANT
    for u, r in recs.items():  # the original beside the text, where the rule changed it
        assert r.get("text_original") == (TEXTS[u] if TEXTS[u] != WANT[u] else None), u
    rejects = {r["utt_id"]: r for r in pq.read_table(out / "rejects.parquet").to_pylist()}
    assert {u: r["reason"] for u, r in rejects.items()} == {
        "emoji": "untranscribable_text", "year": "unreadable_number", "dots": "empty_text"}
    assert "'🙂' (U+1F642 SLIGHTLY SMILING FACE) in 'séven 🙂'" in rejects["emoji"]["detail"]
    assert rejects["year"]["detail"].startswith("1999 in 'in 1999'")
    assert s["counts"] == {"in": 10, "out": 7, "rejected": 3}
    # the lexicon holds the normalized words, whole, and nothing else
    words = {ln.split()[0] for ln in (out / "lexicon.txt").read_text().splitlines()}
    assert words == {w for t in WANT.values() for w in t.split()}
    assert not words & {"s", "ven", "séven", "42", "1999", "🙂", "ﬁsh", "e-mail"}
    made = json.loads((out / "_imports" / "labeled.g2p.json").read_text())["made"]
    assert set(made) == words


def test_import_refuses_a_locale_without_a_rule_before_writing(tmp_path):
    with pytest.raises(ConfigError, match="ingest.locale.*no transcript rule"):
        _import(tmp_path, "ingest.locale=sw-KE")
    assert not (tmp_path / "corpus").exists()


def test_lhotse_supervisions_take_the_same_rule(tmp_path):
    m = tmp_path / "m"
    m.mkdir()
    sf.write(m / "r1.wav", 0.1 * np.sin(np.arange(48000) / 5.0), 16000, subtype="PCM_16")
    (m / "recordings.jsonl").write_text(json.dumps(
        {"id": "r1", "sources": [{"type": "file", "channels": [0], "source": "r1.wav"}],
         "sampling_rate": 16000, "num_samples": 48000, "duration": 3.0,
         "channel_ids": [0]}) + "\n")
    sups = [("s1", 0.0, "Séven 🙂"), ("s2", 1.0, "Good-bye, Zoë!"), ("s3", 2.0, "fine")]
    (m / "supervisions.jsonl").write_text("".join(json.dumps(
        {"id": i, "recording_id": "r1", "start": t, "duration": 1.0, "channel": 0,
         "text": x, "speaker": "a"}, ensure_ascii=False) + "\n" for i, t, x in sups),
        encoding="utf-8")
    from tasks.importers import read_lhotse

    cfg = load_config(None, [f"storage.root={tmp_path / 'store'}"])
    st = Storage(cfg.storage)
    s = import_corpus(st, read_lhotse(st, str(m / "recordings.jsonl"),
                                      str(m / "supervisions.jsonl")),
                      str(tmp_path / "corpus"), cfg.ingest)
    assert s["counts"] == {"in": 3, "out": 2, "rejected": 1}
    assert s["rejects_by_reason"] == {"untranscribable_text": 1}
    lines = (tmp_path / "corpus" / "metadata" / "split=labeled" /
             "labeled-part-00000.jsonl").read_text(encoding="utf-8").splitlines()
    got = {r["utt_id"]: (r["text"], r.get("text_original")) for r in map(json.loads, lines)}
    assert got == {"s2": ("good bye zoe", "Good-bye, Zoë!"), "s3": ("fine", None)}
