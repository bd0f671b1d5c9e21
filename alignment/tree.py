"""The phonetic decision tree, written by hand: kaldi-hmm-gmm has no acc-tree-stats,
cluster-phones or build-tree, only the ContextDependency that reads a finished tree.

    TreeStats                     per (left, phone, right, pdf class): count, sum, sum of squares
                                  of the features (acc-tree-stats); summed over shards
    phone_questions(stats, ...)   phone sets to ask about: a top-down 2-means clustering of the
                                  phones' mean vectors, every node a set (cluster-phones)
    build_tree(stats, ...)        one root per (phone, pdf class); greedy splits on the left or
                                  right phone, the best likelihood gain first over all leaves,
                                  until `num_leaves` leaves (build-tree); silence is not split
    Tree.to_kaldi() / context_dependency()
                                  Kaldi's binary ContextDependency (N=3, P=1): TE on the central
                                  phone, TE on the pdf class, SE questions, CE leaf = pdf id

Each leaf's likelihood is a diagonal Gaussian's on its pooled statistics; constants cancel
in a split's gain. Any (left, phone, right, state), seen or not, reaches a leaf: every
question has a yes and a no branch, and an unseen root still gets a leaf.
"""
from __future__ import annotations

import heapq
import pickle
import struct
from dataclasses import dataclass, field

import kaldi_hmm_gmm as khg  # first: see alignment/__init__.py
import numpy as np

from core.senones import CONTEXT_KIND

PDF_CLASS_KEY = -1  # Kaldi's kPdfClass
VAR_FLOOR = 1e-2    # features are CMVN'd (unit variance)


@dataclass
class TreeStats:
    """(left, phone, right, pdf_class) -> [count, sum (D), sum of squares (D)]."""
    dim: int
    table: dict[tuple[int, int, int, int], np.ndarray] = field(default_factory=dict)

    def add_frames(self, keys: np.ndarray, feats: np.ndarray) -> None:
        """keys [T, 4] int, feats [T, D]."""
        uniq, inv = np.unique(keys, axis=0, return_inverse=True)
        inv = inv.reshape(-1)
        acc = np.zeros((len(uniq), 1 + 2 * self.dim))
        np.add.at(acc, inv, np.concatenate([np.ones((len(feats), 1)), feats, feats ** 2], 1))
        for k, row in zip(map(tuple, uniq.tolist()), acc):
            cur = self.table.get(k)
            self.table[k] = row if cur is None else cur + row

    def merge(self, other: "TreeStats") -> "TreeStats":
        for k, row in other.table.items():
            cur = self.table.get(k)
            self.table[k] = row.copy() if cur is None else cur + row
        return self


def phone_contexts(phones: np.ndarray, start: np.ndarray, boundary: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Per frame: the phone before and after the frame's phone segment (`start` marks each
    segment's first frame); `boundary` at the utterance's ends."""
    seg = np.cumsum(start) - 1
    seq = phones[start]
    left = np.concatenate([[boundary], seq[:-1]])[seg]
    right = np.concatenate([seq[1:], [boundary]])[seg]
    return left, right


def _objf(n: np.ndarray, s: np.ndarray, ss: np.ndarray) -> np.ndarray:
    """Diagonal-Gaussian log-likelihood of pooled stats, without the constant terms."""
    n_ = np.maximum(n, 1e-10)[..., None]
    var = np.maximum(ss / n_ - (s / n_) ** 2, VAR_FLOOR)
    return -0.5 * n * np.log(var).sum(-1)


def phone_questions(stats: TreeStats, phones: list[int]) -> list[frozenset[int]]:
    """Top-down binary 2-means clustering of the phones' means (every state pooled);
    each cluster of the hierarchy, singletons included, is a question."""
    d = stats.dim
    mean = {p: np.zeros(d) for p in phones}
    cnt = {p: 0.0 for p in phones}
    for (_, p, _, _), row in stats.table.items():
        if p in mean:
            cnt[p] += row[0]
            mean[p] += row[1:1 + d]
    for p in phones:
        mean[p] = mean[p] / max(cnt[p], 1e-10)
    out: list[frozenset[int]] = []
    todo = [list(phones)]
    while todo:
        group = todo.pop()
        out.append(frozenset(group))
        if len(group) > 1:
            a, b = _two_means(group, mean, cnt)
            todo += [a, b]
    return sorted(set(out), key=lambda q: (len(q), sorted(q)))


def _two_means(group: list[int], mean: dict, cnt: dict) -> tuple[list[int], list[int]]:
    x = np.stack([mean[p] for p in group])
    w = np.array([max(cnt[p], 1e-3) for p in group])
    far = int(np.argmax(((x - np.average(x, 0, w)) ** 2).sum(1)))
    c = np.stack([x[far], x[int(np.argmax(((x - x[far]) ** 2).sum(1)))]])
    lab = np.zeros(len(group), int)
    for _ in range(10):
        lab = np.argmin(((x[:, None, :] - c[None]) ** 2).sum(-1), axis=1)
        if lab.min() == lab.max():  # identical means: split the list in two
            lab = (np.arange(len(group)) >= len(group) // 2).astype(int)
        c = np.stack([np.average(x[lab == k], 0, w[lab == k]) for k in (0, 1)])
    return [p for p, k in zip(group, lab) if k == 0], [p for p, k in zip(group, lab) if k == 1]


@dataclass
class _Leaf:
    phone: int
    pdf_class: int
    rows: np.ndarray          # [E, 1 + 2D] stats of the contexts it holds
    ctx: np.ndarray           # [E, 2] (left, right)
    splittable: bool = True
    pdf: int = -1


@dataclass
class _Split:
    key: int                  # 0: left phone, 2: right phone
    yes_set: frozenset[int]
    yes: object
    no: object


@dataclass
class Tree:
    roots: dict[int, dict[int, object]]   # phone -> pdf class -> node
    num_leaves: int
    leaf_stats: list[np.ndarray]          # pdf id -> [1 + 2D] pooled stats
    num_phones: int                       # largest phone id + 1

    def to_kaldi(self) -> bytes:
        """Kaldi's binary ContextDependency, without the "\\0B" file header."""
        phones = [self.roots.get(p) for p in range(self.num_phones)]
        body = _tok("TE") + _i32(1) + _u32(len(phones)) + _tok("(")
        for per_class in phones:
            if per_class is None:
                body += _tok("NULL")
                continue
            body += _tok("TE") + _i32(PDF_CLASS_KEY) + _u32(len(per_class)) + _tok("(")
            body += b"".join(_node_bytes(per_class[c]) for c in range(len(per_class)))
            body += _tok(")")
        body += _tok(")")
        return (_tok("ContextDependency") + _i32(3) + _i32(1) + _tok("ToPdf") + body
                + _tok("EndContextDependency"))

    def to_plain(self, phone_names: list[str], sil: str) -> dict:
        """A one-pdf-class tree (the network's) as core.senones.ContextTree's JSON form."""
        def plain(node: object) -> object:
            if isinstance(node, _Leaf):
                return node.pdf
            return [node.key, sorted(node.yes_set), plain(node.yes), plain(node.no)]

        roots = {str(p): plain(per[0]) for p, per in sorted(self.roots.items())}
        return {"kind": CONTEXT_KIND, "phones": list(phone_names), "sil": sil,
                "num_leaves": self.num_leaves, "roots": roots}

    def context_dependency(self) -> khg.ContextDependency:
        """The tree as kaldi-hmm-gmm's ContextDependency (read by Kaldi's own reader)."""
        data = np.frombuffer(self.to_kaldi(), np.int8).tolist()
        return _cd_from_bytes(data)


def _cd_from_bytes(data: list[int]) -> khg.ContextDependency:
    # the binding's only reader is its pickle hook, which runs Kaldi's binary Read
    return pickle.loads(pickle.dumps(_Pickled(data)))


class _Pickled:
    def __init__(self, data: list[int]):
        self.data = data

    def __reduce__(self):
        return (_restore, (self.data,))


def _restore(data: list[int]) -> khg.ContextDependency:
    cd = khg.ContextDependency.__new__(khg.ContextDependency)
    cd.__setstate__((data,))
    return cd


def _tok(s: str) -> bytes:
    return s.encode() + b" "


def _i32(v: int) -> bytes:
    return b"\x04" + struct.pack("<i", v)


def _u32(v: int) -> bytes:
    return b"\xfc" + struct.pack("<I", v)  # size byte -4: unsigned 4-byte type


def _node_bytes(node: object) -> bytes:
    if isinstance(node, _Leaf):
        return _tok("CE") + _i32(node.pdf)
    ys = sorted(node.yes_set)
    return (_tok("SE") + _i32(node.key) + b"\x04" + struct.pack("<i", len(ys))
            + struct.pack(f"<{len(ys)}i", *ys) + _tok("{") + _node_bytes(node.yes)
            + _node_bytes(node.no) + _tok("}"))


def _best_split(leaf: _Leaf, questions: np.ndarray, qsets: list[frozenset[int]],
                num_phones: int, min_count: float) -> tuple[float, int, int]:
    """(gain, key, question index) of the leaf's best split; gain -inf when none."""
    best = (-np.inf, 0, -1)
    if not leaf.splittable or len(leaf.rows) < 2:
        return best
    tot = leaf.rows.sum(0)
    d = (leaf.rows.shape[1] - 1) // 2
    parent = float(_objf(tot[0], tot[1:1 + d], tot[1 + d:]))
    for col, key in ((0, 0), (1, 2)):
        agg = np.zeros((num_phones, leaf.rows.shape[1]))
        np.add.at(agg, leaf.ctx[:, col], leaf.rows)
        yes = questions @ agg                   # [nq, 1 + 2D]
        no = tot[None] - yes
        ok = (yes[:, 0] >= min_count) & (no[:, 0] >= min_count)
        if not ok.any():
            continue
        gain = (_objf(yes[:, 0], yes[:, 1:1 + d], yes[:, 1 + d:])
                + _objf(no[:, 0], no[:, 1:1 + d], no[:, 1 + d:]) - parent)
        gain = np.where(ok, gain, -np.inf)
        q = int(np.argmax(gain))
        if gain[q] > best[0]:
            best = (float(gain[q]), key, q)
    return best


def build_tree(stats: TreeStats, phone_classes: dict[int, int], num_leaves: int,
               no_split: set[int], min_count: float = 20.0) -> Tree:
    """Grow the tree to `num_leaves` leaves (fewer when no split has enough data).
    `phone_classes`: phone -> number of pdf classes; `no_split`: phones kept
    context-independent (silence)."""
    num_phones = max(phone_classes) + 1
    leaves = _root_leaves(stats, phone_classes, no_split)
    if num_leaves < len(leaves):
        raise ValueError(f"num_senones {num_leaves} is below the {len(leaves)} "
                         f"(phone, state) roots")
    ctx_phones = sorted(phone_classes)
    qsets = phone_questions(stats, ctx_phones)
    questions = np.zeros((len(qsets), num_phones))
    for i, q in enumerate(qsets):
        questions[i, sorted(q)] = 1.0
    parent_of: dict[int, tuple[object, str]] = {}
    nodes: dict[int, _Leaf] = {id(lf): lf for lf in leaves}
    heap = [(-g, id(lf), k, q) for lf in leaves
            for g, k, q in [_best_split(lf, questions, qsets, num_phones, min_count)]
            if q >= 0]
    heapq.heapify(heap)
    roots: dict[int, dict[int, object]] = {}
    for lf in leaves:
        roots.setdefault(lf.phone, {})[lf.pdf_class] = lf
    count = len(leaves)
    while heap and count < num_leaves:
        _, lid, key, q = heapq.heappop(heap)
        lf = nodes.pop(lid)
        col = 0 if key == 0 else 1
        mask = np.isin(lf.ctx[:, col], sorted(qsets[q]))
        kids = [_Leaf(lf.phone, lf.pdf_class, lf.rows[m], lf.ctx[m]) for m in (mask, ~mask)]
        split = _Split(key, qsets[q], kids[0], kids[1])
        _replace(roots, parent_of, lf, split)
        for side, kid in zip(("yes", "no"), kids):
            nodes[id(kid)] = kid
            parent_of[id(kid)] = (split, side)
            g, k2, q2 = _best_split(kid, questions, qsets, num_phones, min_count)
            if q2 >= 0:
                heapq.heappush(heap, (-g, id(kid), k2, q2))
        count += 1
    return _number(roots, num_phones, stats.dim)


def _root_leaves(stats: TreeStats, phone_classes: dict[int, int],
                 no_split: set[int]) -> list[_Leaf]:
    width = 1 + 2 * stats.dim
    per: dict[tuple[int, int], list] = {}
    for (l, p, r, c), row in stats.table.items():
        per.setdefault((p, c), []).append(((l, r), row))
    out = []
    for p in sorted(phone_classes):
        for c in range(phone_classes[p]):
            items = per.get((p, c), [])
            rows = np.array([r for _, r in items]).reshape(-1, width)
            ctx = np.array([lr for lr, _ in items], dtype=np.int64).reshape(-1, 2)
            out.append(_Leaf(p, c, rows, ctx, splittable=p not in no_split))
    return out


def _replace(roots: dict, parent_of: dict, leaf: _Leaf, node: _Split) -> None:
    where = parent_of.pop(id(leaf), None)
    if where is None:
        roots[leaf.phone][leaf.pdf_class] = node
    else:
        setattr(where[0], where[1], node)


def _number(roots: dict, num_phones: int, dim: int) -> Tree:
    stats: list[np.ndarray] = []

    def walk(node: object) -> None:
        if isinstance(node, _Leaf):
            node.pdf = len(stats)
            stats.append(node.rows.sum(0) if len(node.rows) else np.zeros(1 + 2 * dim))
        else:
            walk(node.yes)
            walk(node.no)

    for p in sorted(roots):
        for c in sorted(roots[p]):
            walk(roots[p][c])
    return Tree(roots, len(stats), stats, num_phones)
