"""Pronunciations for a user's words: phone-set conventions recognised (or refused
loudly), espeak-ng G2P in the lexicon's phone set at import, align.closure_stops by case."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from core.config import ConfigError, load_config
from core.storage import Storage
from tasks.speech.phone_sets import detect, resolve_names

ARPA = ("hello HH AH0 L OW1\nworld W ER1 L D\ngood G UH1 D\nmore M AO1 R\nsing S IH1 NG\n"
        "in IH0 N\nbit B IH1 T\npot P AA1 T\nkey K IY1\n")


def test_phone_set_conventions():
    assert detect({"h", "@", "l", "oU", "w", "3:", "d", "T", "D"}).kind == "espeak"
    upper = detect({"HH", "AH0", "L", "OW1", "W", "ER1", "D"})
    assert (upper.kind, upper.upper, upper.stress["AH"]) == ("arpabet", True, "0")
    lower = detect({"hh", "ah", "l", "ow", "w", "er", "d", "k"})
    assert (lower.kind, lower.upper, lower.stress) == ("arpabet", False, {})
    assert detect({"pʰ", "ɑ", "ʃ", "x1"}).kind == "other"
    # espeak-ng's "morning" (m O@ n I N) in each convention
    said = ["m", "O@", "n", "I", "N"]
    assert upper.from_espeak(said) == (None, "phones not in the lexicon: AO1 IH1 M N NG R")
    assert lower.from_espeak(said)[1].startswith("phones not in the lexicon")
    lower.phones |= {"m", "ao", "r", "n", "ih", "ng"}
    assert lower.from_espeak(said) == (["m", "ao", "r", "n", "ih", "ng"], "")
    assert detect({"pʰ"}).from_espeak(said)[0] is None
    # config phone names found by case (and stress), the rest reported
    assert resolve_names(["p", "t", "k"], {"P", "T", "K", "AH0"}) == (["P", "T", "K"], [])
    assert resolve_names(["p", "t", "k"], {"p", "t", "T", "k"}) == (["p", "t", "k"], [])
    assert resolve_names(["p", "q"], {"P", "B"}) == (["P"], ["q"])


def test_align_closure_stops_follow_the_lexicons_case(caplog):
    from amflow.steps.align import closure_stops
    from core.runs import StepError
    from decoding.lexicon import read_lexicon

    lex = read_lexicon(ARPA)
    with caplog.at_level("INFO", logger="amflow.steps.align"):
        assert closure_stops(["p", "t", "k"], lex, "lex.txt") == {"P", "T", "K"}
    assert "are ['P', 'T', 'K']" in caplog.text
    with pytest.raises(StepError, match="align.closure_stops.*none is a phone"):
        closure_stops(["x", "y"], lex, "lex.txt")


def _kaldi(root: Path, texts: dict[str, str]) -> Path:
    d = root / "kaldi"
    d.mkdir(parents=True)
    for u in texts:
        sf.write(root / f"{u}.wav", 0.1 * np.sin(np.arange(8000) / 5.0), 16000,
                 subtype="PCM_16")
    (d / "wav.scp").write_text("".join(f"{u} {root / u}.wav\n" for u in texts))
    (d / "utt2spk").write_text("".join(f"{u} s\n" for u in texts))
    (d / "text").write_text("".join(f"{u} {t}\n" for u, t in texts.items()))
    return d


def _import(tmp_path: Path, d: Path, *sets: str) -> dict:
    from tasks.importers import import_corpus, read_kaldi

    cfg = load_config(None, [f"storage.root={tmp_path / 'store'}", *sets])
    st = Storage(cfg.storage)
    return import_corpus(st, read_kaldi(st, str(d)), str(tmp_path / "corpus"), cfg.ingest)


def test_import_pronounces_missing_words_in_the_lexicons_phone_set(tmp_path):
    """ARPAbet with stress digits: "morning" gets one (M AO1 R N IH? NG); "zoo" needs
    phones the lexicon lacks (Z, UW): its utterance is a no_pronunciation reject."""
    (tmp_path / "lex.txt").write_text(ARPA)
    d = _kaldi(tmp_path, {"a": "hello world", "b": "good morning", "c": "zoo"})
    s = _import(tmp_path, d, f"ingest.lexicon={tmp_path / 'lex.txt'}", "ingest.g2p=espeak")
    out = tmp_path / "corpus"
    assert s["counts"] == {"in": 3, "out": 2, "rejected": 1}
    rej = pq.read_table(out / "rejects.parquet").to_pylist()
    assert [(r["utt_id"], r["reason"]) for r in rej] == [("c", "no_pronunciation")]
    assert "zoo: phones not in the lexicon: UW1 Z" in rej[0]["detail"]
    lex = (out / "lexicon.txt").read_text()
    assert lex.startswith(ARPA)
    (line,) = [ln for ln in lex.splitlines() if ln.startswith("morning ")]
    assert line.split()[1:4] == ["M", "AO1", "R"] and line.split()[-1] == "NG"
    review = (out / "lexicon_g2p.txt").read_text()
    assert line in review and "# no pronunciation: zoo:" in review
    assert s["lexicon"]["g2p_words"] == 1 and s["lexicon"]["g2p_failed"] == 1
    # off: the same words are oov_words rejects (nothing made)
    s2 = _import(tmp_path / "off", d, f"ingest.lexicon={tmp_path / 'lex.txt'}")
    assert s2["rejects_by_reason"] == {"oov_words": 2}


def test_import_without_a_lexicon_makes_one_and_refuses_an_unknown_phone_set(tmp_path):
    d = _kaldi(tmp_path, {"a": "hello world", "b": "good"})
    s = _import(tmp_path, d, "ingest.g2p=espeak")
    lex = (tmp_path / "corpus" / "lexicon.txt").read_text().splitlines()
    assert "hello h @ l oU" in lex and len(lex) == 3 and s["lexicon"]["g2p_words"] == 3
    (tmp_path / "ipa.txt").write_text("hello h ɛ l oʊ\nworld w ɝ l d\n")
    with pytest.raises(ConfigError, match="ingest.g2p.*neither espeak-ng's nor ARPAbet"):
        _import(tmp_path / "ipa", d, f"ingest.lexicon={tmp_path / 'ipa.txt'}",
                "ingest.g2p=espeak")
    with pytest.raises(ConfigError, match="ingest.g2p"):
        load_config(None, ["ingest.g2p=festival"])
    assert json.loads((tmp_path / "corpus" / "_imports" / "labeled.g2p.json").read_text())[
        "made"]["good"] == ["g", "U", "d"]
