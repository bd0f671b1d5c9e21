"""The corpus's lexicon.txt: the user's (ingest.lexicon) plus what G2P made (ingest.g2p).

    _imports/lexicon.base.txt      the last ingest.lexicon given (kept for later imports)
    _imports/<source>.g2p.json     the pronunciations G2P made for that split's words,
                                   and the words it could not pronounce, with why
    lexicon.txt                    base + every split's G2P words (what align, lm and
                                   decode read as <corpus>/lexicon.txt)
    lexicon_g2p.txt                the G2P words alone, to review (Kaldi format; the
                                   words without a pronunciation as `#` comments)
"""
from __future__ import annotations

import logging
from collections import Counter

from core.config import ConfigError, IngestConfig
from core.storage import Storage, join
from tasks.importers.entries import Entry
from tasks.importers.ledger import LEDGERS
from tasks.speech.lexicon import Lexicon, read_lexicon, words_of
from tasks.speech.phone_sets import PhoneSet, detect

log = logging.getLogger(__name__)

LEXICON = "lexicon.txt"
REVIEW = "lexicon_g2p.txt"
BASE = "lexicon.base.txt"


def phone_set_of(lexicon_text: str) -> PhoneSet:
    """The base lexicon's phone set; espeak-ng's own (any phone) without one."""
    if not lexicon_text:
        return PhoneSet("espeak", set())
    lex = read_lexicon(lexicon_text)
    counts = Counter(p for vs in lex.prons.values() for v in vs for p in v)
    return detect(counts, counts)


def pronounce(storage: Storage, out: str, words: list[str], lexicon_text: str,
              icfg: IngestConfig) -> tuple[dict[str, list[str]], dict[str, str]]:
    """G2P for `words` in the base lexicon's phone set; a ConfigError naming ingest.g2p
    when that set is one G2P cannot spell in (never a silent gap)."""
    if not words:
        return {}, {}
    ps = phone_set_of(lexicon_text)
    if ps.kind == "other":
        sample = " ".join(sorted(ps.phones)[:12])
        raise ConfigError("ingest.g2p", f"the phones of ingest.lexicon ({sample} ...) are "
                          f"neither espeak-ng's nor ARPAbet, so G2P cannot spell the "
                          f"{len(words)} words missing from it ({' '.join(words[:10])} ...) "
                          f"in them: add those words to ingest.lexicon, or set "
                          f"ingest.g2p=off to reject their utterances as oov_words")
    from tasks.speech.g2p import pronounce as g2p  # deferred: loads espeak-ng

    log.info("import: %d words not in %s: G2P (espeak-ng %s) in the lexicon's phone set "
             "(%s%s)", len(words), icfg.lexicon or "any lexicon", icfg.g2p_language,
             ps.kind, "" if ps.kind != "arpabet" else
             f", {'upper' if ps.upper else 'lower'} case"
             f"{', stress digits' if ps.stress else ''}")
    return g2p(words, ps, icfg.g2p_language)


def write_g2p(storage: Storage, out: str, source: str, made: dict[str, list[str]],
              failed: dict[str, str], entries: list[Entry]) -> None:
    """That source split's share of what G2P made and could not make."""
    words = {w for e in entries if e.text for w in words_of(e.text)}
    uri = join(out, LEDGERS, f"{source}.g2p.json")
    if not made and not failed and not storage.exists(uri):
        return
    storage.write_json(uri, {"made": {w: p for w, p in sorted(made.items()) if w in words},
                             "failed": {w: y for w, y in sorted(failed.items()) if w in words}})


def write_lexicon(storage: Storage, out: str, lexicon_text: str,
                  ledgers: dict[str, dict]) -> dict | None:
    """lexicon.txt and lexicon_g2p.txt from the base and every split's G2P words; a
    summary for _SUCCESS.json (None: no lexicon at all)."""
    base_uri = join(out, LEDGERS, BASE)
    if lexicon_text:
        storage.write_text(base_uri, lexicon_text)
    elif storage.exists(base_uri):
        lexicon_text = storage.read_text(base_uri)
    made: dict[str, list[str]] = {}
    failed: dict[str, str] = {}
    for s in sorted(ledgers):
        uri = join(out, LEDGERS, f"{s}.g2p.json")
        if storage.exists(uri):
            got = storage.read_json(uri)
            made.update(got["made"])
            failed.update(got["failed"])
    base = read_lexicon(lexicon_text) if lexicon_text else Lexicon()
    new = Lexicon()
    for w, phones in sorted(made.items()):
        if w not in base:
            new.add(w, phones)
    if not lexicon_text and not new.prons:
        return None
    storage.write_text(join(out, LEXICON), (lexicon_text.rstrip("\n") + "\n"
                                            if lexicon_text else "") + new.to_text())
    if new.prons or failed:
        storage.write_text(join(out, REVIEW), (
            "# Pronunciations espeak-ng made for words not in ingest.lexicon "
            "(amflow import, ingest.g2p):\n# review them; to change one, put the word in "
            "ingest.lexicon and import again with --force.\n" + new.to_text()
            + "".join(f"# no pronunciation: {w}: {why}\n" for w, why in
                      sorted(failed.items()) if w not in made)))
    return {"words": len(base) + len(new), "from_ingest_lexicon": len(base),
            "g2p_words": len(new), "g2p_failed": len(set(failed) - set(made)),
            "review": join(out, REVIEW) if new.prons or failed else None}
