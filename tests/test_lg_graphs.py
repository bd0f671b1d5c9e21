"""One L o G build (decoding.graph.compose_lg) serves the phone graphs (H o L o G, with
optional silence) and the CTC graph (T o L o G, without): the graphs it builds are the ones
the two copies it replaced built, to the last arc and weight.

The digests are of each graph's FST text (every arc, its labels and weight) as the two
builders wrote it before they shared compose_lg (the tiny lexicon and LMs of
tests/test_decoding.py and tests/test_ctc.py; the pinned kaldifst / kaldilm)."""
from __future__ import annotations

import hashlib

import pytest

from decoding import graph as G
from decoding import lexicon as L
from decoding import lm
from decoding.ctc_graph import build_tlg
from decoding.lexicon import words_of
from tests.test_ctc import TEXTS
from tests.test_decoding import CLASSES, LEXICON, _sentences
from training.ctc.tokens import train_tokenizer

# (states, arcs, LG states, sha256 of the FST text's first 16 hex digits)
PHONE_GRAPHS = {(2, 0.5): (74, 154, 28, "735d7d278753bffa"),
                (2, 0.3): (74, 154, 28, "777b230afc5b21f4"),
                (3, 0.5): (151, 303, 63, "4082c753cd4c2ea9"),
                (3, 0.3): (151, 303, 63, "23fcb4f66ffdfa6d")}
CTC_GRAPHS = {("char", False): (177, 391, 79, "d75681de6bf4a712"),
              ("char", True): (49, 109, 22, "7aaa03e1e52f4cbe"),
              ("bpe", False): (105, 248, 42, "a36053b8d6884747"),
              ("bpe", True): (21, 53, 8, "f2d44d832540aeda")}


def _seen(graph: G.DecodingGraph, kind: str) -> tuple[int, int, int, str]:
    text = graph.fst.to_str(show_weight_one=True)
    info = graph.info
    return (info[f"{kind}_states"], info[f"{kind}_arcs"], info["LG_states"],
            hashlib.sha256(text.encode()).hexdigest()[:16])


@pytest.mark.parametrize("order,sil_prob", sorted(PHONE_GRAPHS))
def test_the_phone_graph_is_the_one_built_before(order, sil_prob):
    arpa = lm.estimate(_sentences(), order).to_arpa()
    graph = G.build_graph(L.read_lexicon(LEXICON), arpa, CLASSES, sil_prob)
    assert _seen(graph, "HLG") == PHONE_GRAPHS[order, sil_prob]


@pytest.mark.parametrize("kind,some_words", sorted(CTC_GRAPHS))
def test_the_ctc_graph_is_the_one_built_before(kind, some_words):
    tok = train_tokenizer(TEXTS, kind, vocab_size=40)
    arpa = lm.estimate([words_of(t) for t in TEXTS], order=2).to_arpa()
    words = ["the", "cat", "ran", "dog", "all"] if some_words else None
    # the compact topology: decode's default before decode.ctc_topology (pinned so a
    # decode with it still reads its graph as before)
    assert _seen(build_tlg(tok, arpa, words, repeats="compact"), "TLG") == CTC_GRAPHS[kind, some_words]


def test_one_lexicon_fst_with_and_without_optional_silence():
    """The CTC L is the phone L without its silence states: the same spelling arcs."""
    lex = L.read_lexicon(LEXICON)
    unit_id = {u: i + 1 for i, u in enumerate(CLASSES)}
    words = [G.EPS, *sorted(lex.prons), G.DISAMBIG_BACKOFF]
    word_id = {w: i for i, w in enumerate(words)}
    disambig = [len(CLASSES) + 1, len(CLASSES) + 2]
    plain = G._lexicon_fst_text(lex, unit_id, word_id, disambig, None).splitlines()
    with_sil = G._lexicon_fst_text(lex, unit_id, word_id, disambig, 0.5).splitlines()
    assert plain[0] == f"0 0 {disambig[0]} {word_id[G.DISAMBIG_BACKOFF]} 0"
    assert len(with_sil) == 3 + len(plain) + lex.num_prons  # + a silence end per pron
    assert not [r for r in plain if r.split()[2:3] == [str(unit_id["sil"])]]
