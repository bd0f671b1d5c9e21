"""The decoding graph T o L o G of a CTC model (training/ctc/): tokens to words.

    build_tlg(tokenizer, arpa_text, words=None, repeats="blank") -> DecodingGraph
        L: the token-to-word lexicon: each word of the vocabulary (the LM's unigrams, or
           `words`) spelled by the model's tokenizer (Tokenizer.encode_word: the word-start
           piece, then characters or BPE pieces), with disambiguation symbols #1.. on
           spellings that are prefixes or duplicates of others (decoding.graph's rule) and
           a #0 self-loop that passes G's back-off disambiguator; no optional silence (a
           CTC model's blank covers pauses). Words the tokenizer can only spell with
           <unk> are left out (counted in info.unspellable).
        G: the ARPA LM (kaldilm.arpa2fst).
        LG = det(L o G), minimised, disambiguators removed (decoding.graph.compose_lg, the
           phone graphs' L o G build without optional silence), then T, the CTC topology,
           by `repeats`:
           repeats="blank" (decode.ctc_topology standard, the default): the standard CTC
           topology (H o L o G): a token follows itself only after a blank, as CTC
           training reads a path, and as sherpa-onnx's graph search does
           (offline-ctc-fst-decoder.cc: a frame whose label is the previous frame's
           continues that token); the graph `amflow export` ships to sherpa-onnx is
           this one, so its words are decode's.
           repeats="compact" (decode.ctc_topology compact): every token arc becomes an
           entry arc and a state that loops on the token (a token lasts one frame or
           more) and leaves by epsilon, and every LG state gets a blank self-loop.
           Like k2's compact CTC topology it also lets two equal tokens follow each
           other without a blank between them.
        Input labels: class id + 1 (class 0, the blank, is label 1): kaldi-decoder's
        DecodableCtc reads column i-1 for label i, so the score matrix is the model's
        log-probabilities (acwt-scaled, blank penalty subtracted) as they come.
    scaled(graph, factor) -> the graph with every arc and final weight times `factor`

The search is decoding.search.Searcher's (FasterDecoder), as for the hybrid graphs.
"""
from __future__ import annotations

import time
from typing import Iterable

from decoding.graph import (DISAMBIG_BACKOFF, EPS, DecodingGraph, GraphError, _add_self_loops,
                            compose_lg)
from decoding.lexicon import Lexicon

BLANK_LABEL = 1


def lm_words(arpa_text: str) -> list[str]:
    """The LM's unigrams, <s>, </s> and <unk> aside."""
    out, section = set(), None
    for line in arpa_text.splitlines():
        if line.startswith("\\"):
            section = line.strip()
            continue
        if section == "\\1-grams:" and "\t" in line:
            out.add(line.split("\t")[1].strip())
    return sorted(out - {"<s>", "</s>", "<unk>"})


def spelling_lexicon(tokenizer, words: Iterable[str]) -> tuple[Lexicon, list[str]]:
    """(word -> its token spelling as a Lexicon, the words left out as unspellable)."""
    lex, skipped = Lexicon(), []
    for w in words:
        if tokenizer.spellable(w):
            lex.add(w, [tokenizer.symbols[i] for i in tokenizer.encode_word(w)])
        else:
            skipped.append(w)
    return lex, skipped


def _lg_text(lex: Lexicon, arpa_text: str, symbols: list[str]) -> tuple[str, list[str], dict]:
    """det(L o G) over the tokens (decoding.graph.compose_lg, without optional silence);
    its word list: the spelled words only."""
    words = [EPS] + sorted(lex.prons) + [DISAMBIG_BACKOFF, "<s>", "</s>"]
    text, sizes = compose_lg(lex, arpa_text, symbols, words, None)
    return text, words, {"words": len(words) - 4, **sizes}


def _states(text: str) -> set[int]:
    states = set()
    for r in text.strip().splitlines():
        f = r.split()
        states.add(int(f[0]))
        if len(f) > 2:
            states.add(int(f[1]))
    return states


def _ctc_topology(lg_text: str, num_classes: int) -> str:
    """T applied to LG's text: token arcs expanded (entry + self-loop + epsilon exit), and
    a blank self-loop on each of LG's own states only: a blank inside a token's state
    would let "t <blank> t" read as one t, where CTC reads two."""
    blank_loops = "".join(f"{s} {s} {BLANK_LABEL} 0 0\n" for s in sorted(_states(lg_text)))
    return _add_self_loops(lg_text, num_classes) + blank_loops


def _lg_rows(lg_text: str) -> tuple[list[tuple[int, int, int, int, str]], dict[int, str]]:
    """LG's arcs (src, dst, ilabel, olabel, weight) and final states {state: weight}."""
    arcs, finals = [], {}
    for r in lg_text.strip().splitlines():
        f = r.split()
        if len(f) <= 2:
            finals[int(f[0])] = f[1] if len(f) > 1 else "0"
        else:
            arcs.append((int(f[0]), int(f[1]), int(f[2]), int(f[3]), f[4] if len(f) > 4 else "0"))
    return arcs, finals


def _last_tokens(by_src: dict[int, list], start: int) -> dict[int, set[int]]:
    """Per LG state reachable from `start`, the labels of the tokens a path can have read
    last on reaching it, and 0 (none yet, or a blank since): a token arc sets it, an
    epsilon arc carries it."""
    out: dict[int, set[int]] = {start: {0}}
    todo = [start]
    while todo:
        q = todo.pop()
        for _, dst, ilab, _, _ in by_src.get(q, []):
            new = {ilab} if ilab else out[q]
            have = out.get(dst)
            if have is None or not new <= have:
                out[dst] = (have or {0}) | new
                todo.append(dst)
    return out


def _standard_topology(lg_text: str) -> str:
    """H applied to LG's text, a state per (LG state, last token): in a token's state the
    token loops, a blank leaves for the LG state's blank state, and every LG token arc
    but the token's own is taken at once (the same token again needs the blank first)."""
    arcs, finals = _lg_rows(lg_text)
    start = arcs[0][0] if arcs else 0  # the text lists the start state first
    by_src: dict[int, list] = {}
    for a in arcs:
        by_src.setdefault(a[0], []).append(a)
    last = _last_tokens(by_src, start)
    ids = {(start, 0): 0}

    def sid(q: int, c: int) -> int:
        return ids.setdefault((q, c), len(ids))

    out = []
    for q in [start] + sorted(set(last) - {start}):
        for c in sorted(last[q]):
            me = sid(q, c)
            out.append(f"{me} {me} {c or BLANK_LABEL} 0 0")  # the token goes on / blanks
            if c:
                out.append(f"{me} {sid(q, 0)} {BLANK_LABEL} 0 0")
            for _, dst, ilab, olab, w in by_src.get(q, []):
                if ilab != c or not ilab:
                    out.append(f"{me} {sid(dst, ilab or c)} {ilab} {olab} {w}")
            if q in finals:
                out.append(f"{me} {finals[q]}")
    return "\n".join(out) + "\n"


def scaled(graph: DecodingGraph, factor: float) -> DecodingGraph:
    """`graph` with every weight times `factor` (sherpa-onnx's search has no LM weight of
    its own: amflow/services/ctc_export.py scales the graph and the scores instead)."""
    import kaldifst

    rows = []
    for r in graph.fst.to_str(show_weight_one=True).strip().splitlines():
        f = r.split()
        if len(f) in (2, 5):
            f[-1] = repr(float(f[-1]) * factor)
        rows.append(" ".join(f))
    fst = kaldifst.compile("\n".join(rows) + "\n")
    kaldifst.arcsort(fst, sort_type="ilabel")
    return DecodingGraph(fst, graph.words, {**graph.info, "weights_scaled_by": factor})


def build_tlg(tokenizer, arpa_text: str, words: Iterable[str] | None = None,
              repeats: str = "blank") -> DecodingGraph:
    """T o L o G for `tokenizer`'s model (see the module doc); repeats="blank": the
    standard CTC topology's H o L o G (CTC's and sherpa-onnx's reading), "compact": k2's
    compact one."""
    import kaldifst

    if repeats not in ("compact", "blank"):
        raise GraphError(f"repeats={repeats!r}: compact or blank")
    t0 = time.time()
    vocab = list(words) if words is not None else lm_words(arpa_text)
    lex, skipped = spelling_lexicon(tokenizer, vocab)
    if not lex.prons:
        raise GraphError("no word of the LM can be spelled with the model's tokens")
    lg, out_words, info = _lg_text(lex, arpa_text, list(tokenizer.symbols))
    # tokens are labels 2..V (class + 1); the blank (label 1) gets no entry/loop state
    fst = kaldifst.compile(_ctc_topology(lg, tokenizer.num_classes) if repeats == "compact"
                           else _standard_topology(lg))
    kaldifst.arcsort(fst, sort_type="ilabel")
    info = {"kind": "TLG", **({} if repeats == "compact" else {"kind": "HLG", "repeats": repeats}),
            "tokens": tokenizer.num_classes, "tokenizer": tokenizer.digest,
            **info, "unspellable": len(skipped), "TLG_states": fst.num_states,
            "TLG_arcs": sum(fst.num_arcs(s) for s in range(fst.num_states)),
            "build_s": round(time.time() - t0, 2)}
    return DecodingGraph(fst, out_words, info)
