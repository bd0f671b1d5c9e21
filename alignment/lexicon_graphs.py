"""Phone and word tables, the HMM topology, the lexicon FST and per-utterance training graphs.

Phone ids: 0 is epsilon, 1 is silence (`sil`), then the lexicon's phones sorted. Word ids:
0 is epsilon, then the words sorted. The lexicon FST L maps phones to words with optional
silence (probability `sil_prob`) before the first word and after every word, and one path
per pronunciation variant, so a transcript's training graph lets the aligner choose both.

Training graphs are compiled with transition_scale = self_loop_scale = 0 (no transition
probabilities in the graph); gmm.align adds the current ones before each alignment. With
the compiler's defaults the graphs carry the probabilities of the initial model and most
alignments fail (measured: /work/shared/notes/alignment-stack.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import kaldi_hmm_gmm as khg  # first: see alignment/__init__.py
import kaldifst

SIL = "sil"
SIL_ID = 1  # phones[1]: make_lang puts silence first after <eps>


class LangError(ValueError):
    pass


@dataclass
class Lang:
    phones: list[str]                  # index = phone id; phones[0] = "<eps>"
    words: list[str]                   # index = word id; words[0] = "<eps>"
    prons: dict[str, list[tuple[str, ...]]] = field(default_factory=dict)
    sil_prob: float = 0.5
    closure_of: dict[str, str] = field(default_factory=dict)  # stop -> its closure phone

    @property
    def phone_id(self) -> dict[str, int]:
        return {p: i for i, p in enumerate(self.phones)}

    @property
    def word_id(self) -> dict[str, int]:
        return {w: i for i, w in enumerate(self.words)}

    @property
    def sil_id(self) -> int:
        return SIL_ID

    @property
    def nonsil_ids(self) -> list[int]:
        return [i for i in range(2, len(self.phones)) if i not in self.closure_ids]

    @property
    def closure_ids(self) -> set[int]:
        return {i for i, p in enumerate(self.phones) if p.endswith(CLOSURE)}


CLOSURE = "_cl"


def closure_phones(stops: set[str], shared: bool) -> dict[str, str]:
    """stop -> its closure phone: `<stop>_cl` each (TIMIT's tcl, kcl, pcl), or one
    closure shared by all (`<stops>_cl`, as TIMIT's 39-phone folding merges them)."""
    one = "".join(sorted(stops)) + CLOSURE
    return {p: one if shared else p + CLOSURE for p in stops}


def with_closures(prons: dict[str, list[tuple[str, ...]]], closure_of: dict[str, str]
                  ) -> dict[str, list[tuple[str, ...]]]:
    """Every stop of `closure_of` preceded by its closure phone: the silent closure of an
    unvoiced stop gets a model of its own instead of stretching the stop's first state;
    ctm.fold_closures gives its frames back to the preceding phone, where espeak-ng's
    phone events put them."""
    return {w: [tuple(q for p in v for q in ((closure_of[p], p) if p in closure_of else (p,)))
                for v in vs] for w, vs in prons.items()}


def make_lang(prons: dict[str, list[tuple[str, ...]]], sil_prob: float = 0.5,
              stops: set[str] | None = None, shared_closure: bool = False) -> Lang:
    """A Lang from a lexicon (word -> pronunciation variants); `stops`: phones that get
    a closure phone (with_closures), one for all with `shared_closure`."""
    if not prons:
        raise LangError("the lexicon has no entries")
    closure_of = closure_phones(stops, shared_closure) if stops else {}
    prons = with_closures(prons, closure_of)
    phones = sorted({p for vs in prons.values() for v in vs for p in v} - {SIL})
    if not phones:
        raise LangError("the lexicon has no phones other than silence")
    return Lang(["<eps>", SIL, *phones], ["<eps>", *sorted(prons)],
                {w: list(v) for w, v in prons.items()}, sil_prob, closure_of)


def topology(lang: Lang, nonsil_states: int = 3, sil_states: int = 5) -> khg.HmmTopology:
    """Kaldi's standard topology: 3-state left-to-right phones, a 5-state silence whose
    middle states are fully connected (as utils/gen_topo.pl writes it)."""
    s = "<Topology> <TopologyEntry> <ForPhones> "
    s += " ".join(map(str, lang.nonsil_ids)) + " </ForPhones> "
    for i in range(nonsil_states):
        s += f"<State> {i} <PdfClass> {i} <Transition> {i} 0.75 <Transition> {i + 1} 0.25 </State> "
    s += f"<State> {nonsil_states} </State> </TopologyEntry> "
    s += f"<TopologyEntry> <ForPhones> {lang.sil_id} </ForPhones> "
    p = 1.0 / (sil_states - 1)
    s += "<State> 0 <PdfClass> 0 " + "".join(
        f"<Transition> {k} {p} " for k in range(sil_states - 1)) + "</State> "
    for i in range(1, sil_states - 1):
        s += f"<State> {i} <PdfClass> {i} " + "".join(
            f"<Transition> {k} {p} " for k in range(1, sil_states)) + "</State> "
    last = sil_states - 1
    s += f"<State> {last} <PdfClass> {last} <Transition> {last} 0.75 "
    s += f"<Transition> {sil_states} 0.25 </State> <State> {sil_states} </State> "
    s += "</TopologyEntry> "
    if lang.closure_ids:  # one state: a closure can be as short as one frame
        s += "<TopologyEntry> <ForPhones> " + " ".join(map(str, sorted(lang.closure_ids)))
        s += " </ForPhones> <State> 0 <PdfClass> 0 <Transition> 0 0.5 <Transition> 1 0.5 "
        s += "</State> <State> 1 </State> </TopologyEntry> "
    s += "</Topology>"
    topo = khg.HmmTopology()
    topo.read(s)
    return topo


def lexicon_fst(lang: Lang) -> kaldifst.StdVectorFst:
    """L: phones -> words, optional silence between words, every pronunciation variant."""
    pid, wid = lang.phone_id, lang.word_id
    sil_cost = -math.log(lang.sil_prob)
    no_sil_cost = -math.log(1.0 - lang.sil_prob)
    fst = kaldifst.StdVectorFst()
    start, loop, sil = fst.add_state(), fst.add_state(), fst.add_state()
    fst.start = start
    fst.set_final(state=loop, weight=0)

    def arc(src: int, il: int, ol: int, w: float, dst: int) -> None:
        fst.add_arc(state=src, arc=kaldifst.StdArc(ilabel=il, olabel=ol, weight=w,
                                                    nextstate=dst))

    arc(start, 0, 0, no_sil_cost, loop)
    arc(start, 0, 0, sil_cost, sil)
    arc(sil, lang.sil_id, 0, 0.0, loop)
    for word in lang.words[1:]:
        for pron in lang.prons[word]:
            cur = loop
            for i, ph in enumerate(pron[:-1]):
                nxt = fst.add_state()
                arc(cur, pid[ph], wid[word] if i == 0 else 0, 0.0, nxt)
                cur = nxt
            last_ol = wid[word] if len(pron) == 1 else 0
            arc(cur, pid[pron[-1]], last_ol, no_sil_cost, loop)
            arc(cur, pid[pron[-1]], last_ol, sil_cost, sil)
    kaldifst.arcsort(fst, sort_type="olabel")
    return fst


def graph_compiler(lang: Lang, tm: khg.TransitionModel, tree: khg.ContextDependency,
                   lfst: kaldifst.StdVectorFst) -> khg.TrainingGraphCompiler:
    # reorder=False: a phone's last frame carries its transition into the final state
    # (with Kaldi's reorder the last state's self-loops follow it), so phone starts are
    # read off an alignment directly (gmm.phones_and_pdfs)
    opts = khg.TrainingGraphCompilerOptions(transition_scale=0.0, self_loop_scale=0.0,
                                            reorder=False)
    return khg.TrainingGraphCompiler(trans_model=tm, ctx_dep=tree, lex_fst=lfst,
                                     disambig_syms=[], opts=opts)


def word_ids(lang: Lang, words: list[str]) -> tuple[list[int] | None, list[str]]:
    """Word ids of a transcript, or (None, the out-of-vocabulary words)."""
    wid = lang.word_id
    oov = [w for w in words if w not in wid]
    return (None, oov) if oov else ([wid[w] for w in words], [])
