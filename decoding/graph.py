"""The decoding graph H o L o G for a model with one output class per phone.

    build_graph(lexicon, arpa_text, classes, sil_prob=0.5) -> DecodingGraph
        L: the lexicon transducer (phones -> words) with optional silence between words
           (probability `sil_prob`, Kaldi's make_lexicon_fst) and disambiguation symbols
           #1.. on pronunciations that are prefixes or duplicates of others, and a #0
           self-loop that passes G's back-off disambiguator;
        G: the ARPA LM as a WFST (kaldilm.arpa2fst, <s>/</s> become epsilons);
        LG = det(L o G) (determinize_star, then minimize_encoded), disambiguators removed;
        H: every phone arc of LG becomes an entry arc and a state with a self-loop on the
           same class: one HMM state per class, so a phone lasts one frame or more (the
           33 Hz low-frame-rate model's topology). The self-loops are added after
           determinisation, as Kaldi adds them to HCLG.
        Input labels are class id + 1 (kaldi-decoder's DecodableCtc reads column i-1 for
        label i; 0 is epsilon); output labels are word ids.
    compose_lg(lex, arpa_text, units, words, sil_prob) -> (text, sizes)
        the L o G above for any units: phones here and in decoding/context.py, a CTC
        model's tokens (sil_prob None: no optional silence) in decoding/ctc_graph.py.
    DecodingGraph.write(dir) / read_graph(dir)   HLG.fst + words.txt + graph.json
    graph_key(lexicon_text, arpa_text, classes, sil_prob) -> str   the cache key

Everything here is kaldifst / kaldilm: the search runs on a maintained WFST toolkit.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Sequence

from decoding.lexicon import SIL, Lexicon

EPS = "<eps>"
DISAMBIG_BACKOFF = "#0"


class GraphError(ValueError):
    pass


@dataclass
class DecodingGraph:
    fst: object  # kaldifst.StdVectorFst
    words: list[str]  # index = output label (0 = <eps>)
    info: dict

    def write(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        self.fst.write(os.path.join(directory, "HLG.fst"))
        with open(os.path.join(directory, "words.txt"), "w") as f:
            f.writelines(f"{w} {i}\n" for i, w in enumerate(self.words))
        with open(os.path.join(directory, "graph.json"), "w") as f:
            json.dump(self.info, f, indent=1)


def read_graph(directory: str) -> DecodingGraph:
    import kaldifst

    fst = kaldifst.StdVectorFst.read(os.path.join(directory, "HLG.fst"))
    with open(os.path.join(directory, "words.txt")) as f:
        words = [line.rsplit(" ", 1)[0] for line in f.read().splitlines()]
    with open(os.path.join(directory, "graph.json")) as f:
        info = json.load(f)
    return DecodingGraph(fst, words, info)


def graph_key(lexicon_text: str, arpa_text: str, classes: Sequence[str], sil_prob: float) -> str:
    h = hashlib.sha256()
    for part in (lexicon_text, arpa_text, "\n".join(classes), repr(sil_prob)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


# ----------------------------------------------------------------- L
def _disambiguated(lex: Lexicon) -> tuple[list[tuple[str, tuple[str, ...], int]], int]:
    """(word, phones, disambiguator number or 0) per pronunciation; the largest number."""
    prons = [(w, v) for w in sorted(lex.prons) for v in lex.prons[w]]
    count: dict[tuple[str, ...], int] = {}
    prefixes: set[tuple[str, ...]] = set()
    for _, v in prons:
        count[v] = count.get(v, 0) + 1
        prefixes.update(v[:k] for k in range(1, len(v)))
    used: dict[tuple[str, ...], int] = {}
    out = []
    for w, v in prons:
        if count[v] > 1 or v in prefixes:
            used[v] = used.get(v, 0) + 1
            out.append((w, v, used[v]))
        else:
            out.append((w, v, 0))
    return out, max(used.values(), default=0)


def _lexicon_fst_text(lex: Lexicon, unit_id: dict[str, int], word_id: dict[str, int],
                      disambig_id: list[int], sil_prob: float | None) -> str:
    """L as FST text: from one loop state every pronunciation is spelled in units (phones
    or tokens), its disambiguator after it, and the word out on its first arc; a #0
    self-loop on the loop state passes G's back-off disambiguator. With `sil_prob`, optional
    silence between words (Kaldi's make_lexicon_fst.py with sil_prob): a start state, and
    each word ends at the loop or, at -log sil_prob, at a state that reads SIL first. None:
    no silence (a CTC model's blank covers pauses), one state that is start and loop."""
    if sil_prob is None:
        loop, next_state, lines = 0, 1, []
        ends = [(loop, "0")]
    else:
        no_sil, sil = -math.log(1 - sil_prob), -math.log(sil_prob)
        start, loop, sil_state, next_state = 0, 1, 2, 3
        lines = [f"{start} {loop} 0 0 {no_sil}", f"{start} {sil_state} 0 0 {sil}",
                 f"{sil_state} {loop} {unit_id[SIL]} 0 0"]
        ends = [(loop, no_sil), (sil_state, sil)]
    lines.append(f"{loop} {loop} {disambig_id[0]} {word_id[DISAMBIG_BACKOFF]} 0")
    entries, _ = _disambiguated(lex)
    for word, units, k in entries:
        labels = [unit_id[u] for u in units] + ([disambig_id[k]] if k else [])
        src, out = loop, word_id[word]
        for lab in labels[:-1]:
            lines.append(f"{src} {next_state} {lab} {out} 0")
            src, out, next_state = next_state, 0, next_state + 1
        lines += [f"{src} {dst} {labels[-1]} {out} {w}" for dst, w in ends]
    lines.append(f"{loop} 0")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------- H
def _add_self_loops(lg_text: str, num_classes: int) -> str:
    """Each arc on class label c (1..num_classes) -> entry arc + a state looping on c."""
    rows = lg_text.strip().splitlines()
    num_states = 1 + max(max(int(r.split()[0]), int(r.split()[1]) if len(r.split()) > 2 else 0)
                         for r in rows)
    out = []
    for r in rows:
        f = r.split()
        if len(f) <= 2:  # final state
            out.append(r)
            continue
        src, dst, ilab, olab = f[:4]
        w = f[4] if len(f) > 4 else "0"
        if ilab == "0" or int(ilab) > num_classes:
            out.append(f"{src} {dst} 0 {olab} {w}")
            continue
        s = num_states
        num_states += 1
        out += [f"{src} {s} {ilab} {olab} {w}", f"{s} {s} {ilab} 0 0", f"{s} {dst} 0 0 0"]
    return "\n".join(out) + "\n"


def _remove_disambig(lg_text: str, first_disambig: int) -> str:
    out = []
    for r in lg_text.strip().splitlines():
        f = r.split()
        if len(f) > 2 and int(f[2]) >= first_disambig:
            f[2] = "0"
        out.append(" ".join(f))
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------- L o G
def compose_lg(lex: Lexicon, arpa_text: str, units: Sequence[str], words: list[str],
               sil_prob: float | None) -> tuple[str, dict]:
    """det(L o G), minimised, with the disambiguators removed, as FST text: the one L o G
    build of the phone graphs (build_lg: units are phones, optional silence) and the CTC
    graph (decoding/ctc_graph.py: units are tokens, sil_prob None). Input labels are unit
    ids (index in `units` + 1), output labels indices in `words` (<eps> first, then the
    back-off disambiguator and <s>, </s> among them). Returns the text and
    {disambig_symbols, G_states, LG_states}."""
    import kaldifst

    unit_id = {u: i + 1 for i, u in enumerate(units)}
    _, max_disambig = _disambiguated(lex)
    disambig_id = [len(units) + 1 + k for k in range(max_disambig + 1)]  # #0, #1, ...
    word_id = {w: i for i, w in enumerate(words)}
    G = compile_g(words, arpa_text)
    L = kaldifst.compile(_lexicon_fst_text(lex, unit_id, word_id, disambig_id, sil_prob))
    kaldifst.arcsort(L, sort_type="olabel")
    kaldifst.arcsort(G, sort_type="ilabel")
    LG = kaldifst.compose(L, G)
    if kaldifst.determinize_star(LG, use_log=True):
        raise GraphError("determinisation of L o G stopped early")
    kaldifst.minimize_encoded(LG)
    text = _remove_disambig(LG.to_str(show_weight_one=True), disambig_id[0])
    return text, {"disambig_symbols": max_disambig, "G_states": G.num_states,
                  "LG_states": LG.num_states}


# ----------------------------------------------------------------- HLG
def build_lg(lex: Lexicon, arpa_text: str, classes: Sequence[str], sil_prob: float
             ) -> tuple[str, list[str], dict]:
    """det(L o G) with the disambiguators removed, as FST text whose input labels are
    phone ids (index in `classes` + 1); its word list; sizes for the graph's info."""
    missing = sorted(lex.phones() - set(classes))
    if missing:
        raise GraphError(f"the lexicon uses phones the model has no class for: {missing}")
    if SIL not in classes:
        raise GraphError(f"the model has no '{SIL}' class (optional silence needs one)")
    lm_words = {line.split()[1] for line in arpa_text.splitlines()
                if line.count("\t") >= 1 and len(line.split("\t")[1].split()) == 1}
    words = [EPS] + sorted(set(lex.prons) | (lm_words - {"<s>", "</s>", "<unk>"}))
    words += [DISAMBIG_BACKOFF, "<s>", "</s>"]
    lg_text, sizes = compose_lg(lex, arpa_text, classes, words, sil_prob)
    info = {"words": len(words) - 4, "prons": lex.num_prons,
            "disambig_symbols": sizes["disambig_symbols"], "sil_prob": sil_prob,
            "G_states": sizes["G_states"], "LG_states": sizes["LG_states"]}
    return lg_text, words, info


def finish_graph(text: str, num_classes: int, words: list[str], info: dict,
                 t0: float) -> DecodingGraph:
    """H: self-loops on every class arc of `text`, compiled and arc-sorted."""
    import kaldifst

    hlg = kaldifst.compile(_add_self_loops(text, num_classes))
    kaldifst.arcsort(hlg, sort_type="ilabel")
    info = {"classes": num_classes, **info, "HLG_states": hlg.num_states,
            "HLG_arcs": sum(hlg.num_arcs(s) for s in range(hlg.num_states)),
            "build_s": round(time.time() - t0, 2)}
    return DecodingGraph(hlg, words, info)


def build_graph(lex: Lexicon, arpa_text: str, classes: Sequence[str],
                sil_prob: float = 0.5) -> DecodingGraph:
    t0 = time.time()
    lg_text, words, info = build_lg(lex, arpa_text, classes, sil_prob)
    return finish_graph(lg_text, len(classes), words, info, t0)


def compile_g(words: list[str], arpa_text: str) -> Any:
    """G: the ARPA LM as an FST over `words` (their index is the label; the back-off
    disambiguation symbol among them), as the hybrid and the CTC graphs both build it."""
    import kaldifst
    import kaldilm

    with tempfile.TemporaryDirectory() as tmp:
        sym, arpa = os.path.join(tmp, "words.txt"), os.path.join(tmp, "lm.arpa")
        with open(sym, "w") as f:
            f.writelines(f"{w} {i}\n" for i, w in enumerate(words))
        with open(arpa, "w") as f:
            f.write(arpa_text)
        g_text = kaldilm.arpa2fst(input_arpa=arpa, disambig_symbol=DISAMBIG_BACKOFF,
                                  read_symbol_table=sym, max_arpa_warnings=0)
    return kaldifst.compile(g_text, acceptor=False)
