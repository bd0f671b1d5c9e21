"""The context-dependent decoding graph H o C o L o G for a model whose classes are the
leaves of the network tree (`amflow align`, features.labels=align; core.senones).

    context_fst_text(tree, phones) -> str
        C, the triphone context transducer, as FST text. Output labels are phone ids
        (index in `phones` + 1, as L's input labels); input labels are the tree's leaf + 1
        (the class the network scores), so C o LG is already relabelled from triphones to
        classes. A state (a, b) has seen phones a then b; reading phone c emits b's class in
        context (a, b, c) and moves to (b, c): the usual one-phone delay. The start emits
        nothing for the first phone (its left context is silence); a final arc emits the
        last phone's class with silence as its right context. Word boundaries are not
        special: the context crosses them (the tree was built on the phone sequence, with
        optional silence where the aligner put it).
    build_cd_graph(lex, arpa_text, tree, sil_prob) -> DecodingGraph
        det(L o G) (decoding/graph.build_lg, disambiguators removed), composed with C,
        then H: an entry arc and a self-loop per class arc, as for the phone graph. Input
        labels are class + 1 (kaldi-decoder's DecodableCtc reads column i-1 for label i).

C is written by hand (as Kaldi's fstmakecontextfst / k2's context graphs define it), with
kaldifst doing the composition.
"""
from __future__ import annotations

import time

from core.senones import ContextTree
from decoding.graph import DecodingGraph, GraphError, build_lg, finish_graph
from decoding.lexicon import Lexicon


def context_fst_text(tree: ContextTree, phones: list[str]) -> str:
    """C over `phones` (silence among them), see the module doc."""
    tid = tree.phone_id
    missing = [p for p in phones if p not in tid or tid[p] not in tree.roots]
    if missing:
        raise GraphError(f"the model's tree has no classes for phones {missing[:20]}")
    sil = tree.sil
    n = len(phones)
    def state(a: int, b: int) -> int:  # (a, b) over indices into `phones`; 0 is the start
        return 1 + a * n + b

    final = 1 + n * n
    isil = phones.index(sil)
    ids = [tid[p] for p in phones]
    lines = [f"0 {state(isil, c)} 0 {c + 1}" for c in range(n)]
    for a in range(n):
        for b in range(n):
            s = state(a, b)
            for c in range(n):
                leaf = tree.leaf_ids(ids[a], ids[b], ids[c])
                lines.append(f"{s} {state(b, c)} {leaf + 1} {c + 1}")
            lines.append(f"{s} {final} {tree.leaf_ids(ids[a], ids[b], tid[sil]) + 1} 0")
    lines.append(f"{final}")
    return "\n".join(lines) + "\n"


def build_cd_graph(lex: Lexicon, arpa_text: str, tree: ContextTree,
                   sil_prob: float = 0.5) -> DecodingGraph:
    import kaldifst  # deferred, as in decoding/graph.py

    t0 = time.time()
    phones = tree.center_phones
    lg_text, words, info = build_lg(lex, arpa_text, phones, sil_prob)
    LG = kaldifst.compile(lg_text)
    C = kaldifst.compile(context_fst_text(tree, phones))
    kaldifst.arcsort(C, sort_type="olabel")
    kaldifst.arcsort(LG, sort_type="ilabel")
    CLG = kaldifst.compose(C, LG)
    kaldifst.connect(CLG)
    if CLG.num_states == 0:
        raise GraphError("C o L o G is empty: no word sequence has a path")
    info = {**info, "context": "triphone", "phones": len(phones), "CLG_states": CLG.num_states}
    return finish_graph(CLG.to_str(show_weight_one=True), tree.num_leaves, words, info, t0)
