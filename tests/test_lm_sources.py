"""`amflow lm` on a corpus that is not the embedded one: the corpus's own text by
default (plus lm.text_file), and WARNINGs when the LM does not fit its dev speech."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.config import ConfigError, load_config
from core.runs import StepContext

WORDS = [f"w{c}{d}" for c in "abcdefgh" for d in "0123456"]  # 56 words none generates


def _corpus(root: Path) -> Path:
    """Metadata only (lm reads no audio): labeled sentences of WORDS, a dev split of
    them, and one dev word (zzz) that no text or lexicon has."""
    lab = [" ".join(WORDS[i:i + 4]) for i in range(0, 48, 2)]
    dev = [" ".join(WORDS[i:i + 4]) for i in range(1, 40, 6)] + ["wa0 zzz wa1"]
    recs = [{"utt_id": f"{s}{i}", "speaker_id": "s", "duration": 1.0,
             "created_at": "2026-01-01T00:00:00Z", "locale": "en-US",
             "audio_uri": f"a/{s}{i}.wav", "text": t, "split": s}
            for s, texts in (("labeled", lab), ("dev", dev)) for i, t in enumerate(texts)]
    (root / "metadata").mkdir(parents=True)
    (root / "metadata" / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (root / "lexicon.txt").write_text("".join(f"{w} {' '.join(w)}\n" for w in WORDS))
    return root


def _lm(tmp_path: Path, run: str, *sets: str) -> dict:
    from amflow.steps import lm

    cfg = load_config(None, [f"storage.root={tmp_path / 'store'}",
                             f"data.corpus={tmp_path / 'corpus'}", *sets])
    return lm.run(StepContext(cfg, run, "lm"))["metrics"]


def test_lm_of_a_users_corpus_is_its_own_text(tmp_path, caplog):
    _corpus(tmp_path / "corpus")
    (tmp_path / "more.txt").write_text("wh0 wh1 wh2\n\nWH3 wh4\n")
    with caplog.at_level("WARNING", logger="decoding.lm_sources"):
        m = _lm(tmp_path, "a", f"lm.text_file={tmp_path / 'more.txt'}")
    assert m["text"] == {"source": "corpus", "transcripts_labeled": 24, "text_file": 2}
    assert m["sentences"] == 26 and m["vocabulary"] == len(WORDS)
    assert m["dev"]["perplexity"] < len(WORDS)
    # one OOV token of 29 dev words: 3.4 %, under the warning's 5 %
    assert m["fit_warnings"] == [] and "perplexity" not in caplog.text
    # the generator's text does not fit: said, with the keys that fix it
    with caplog.at_level("WARNING", logger="decoding.lm_sources"):
        g = _lm(tmp_path, "b", "lm.source=generator", "lm.sentences=300")
    assert g["text"] == {"source": "generator", "generator": 300}
    assert g["dev"]["perplexity"] > g["vocabulary"]
    assert any("above the vocabulary size" in w and "lm.source=corpus" in w
               for w in g["fit_warnings"])
    assert "dev perplexity" in caplog.text


def test_lm_text_keys_are_checked(tmp_path):
    _corpus(tmp_path / "corpus")
    with pytest.raises(ConfigError, match="lm.text_file"):
        _lm(tmp_path, "b", f"lm.text_file={tmp_path / 'nope.txt'}")
    with pytest.raises(ConfigError, match="lm.source"):
        load_config(None, ["lm.source=mine"])


def test_lm_oov_warning(tmp_path):
    from decoding.lm_sources import fit_warnings

    made = {"source": "corpus"}
    assert fit_warnings({"dev": {"perplexity": 10.0, "oov_rate": 0.01}}, 100, made) == []
    (w,) = fit_warnings({"dev": {"perplexity": 10.0, "oov_rate": 0.2}}, 100, made)
    assert "dev OOV rate 20.0 %" in w and "lm.text_file" in w
