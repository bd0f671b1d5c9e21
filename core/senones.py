"""Context-dependent network classes: the network tree `amflow align` builds, as plain data.

The network runs at the low frame rate with one HMM state per class, so its classes are
the leaves of a second decision tree over (left phone, phone, right phone) with one pdf
class per phone (Kaldi's chain recipes build such a tree, build_tree.sh, for the network's
topology). `amflow align` writes it as `nn_tree.json` (alignment/tree.py builds it);
features, training, evaluate and decoding read it here, so no layer above amflow/ needs
alignment/ to use it.

    ContextTree.from_dict(d) / to_dict()   the JSON form, also carried in a model card
                                           (ModelCard.context)
    ContextTree.leaf(left, phone, right)   the class of a phone in context (phone names);
                                           utterance boundaries are silence context
    ContextTree.leaf_phone                 class id -> its central phone's name
    ContextTree.leaf_center                class id -> its phone's index in center_phones
    ContextTree.class_names                the class list: "<phone>/<leaf>" per class
    ContextTree.phone_tree()               one leaf per phone (a class id of it is
                                           `leaf_center` of this tree's leaf)
    fit_frames(labels, num_frames, tolerance) -> (labels | None, detail)
        per-10 ms labels from another front end fitted to this one's frame count: a
        difference of up to `tolerance` frames is trimmed, or padded with the last label

Tree nodes: an int is a leaf (class id); a list [key, yes_phones, yes, no] asks whether
the left (key 0) or right (key 2) phone is in `yes_phones` (phone ids of `phones`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

CONTEXT_KIND = "triphone-tree/1"
SIL = "sil"


class ContextTreeError(ValueError):
    pass


@dataclass(frozen=True)
class ContextTree:
    phones: list[str]              # phone id -> name (id 0 is <eps>, unused as a context)
    roots: dict[int, Any]          # central phone id -> node
    num_leaves: int
    sil: str = SIL

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ContextTree":
        if not isinstance(d, dict) or d.get("kind") != CONTEXT_KIND:
            raise ContextTreeError(f"not a context tree ({CONTEXT_KIND}): "
                                   f"kind={d.get('kind') if isinstance(d, dict) else d!r}")
        phones = list(d["phones"])
        if d.get("sil", SIL) not in phones:
            raise ContextTreeError(f"the context tree has no silence phone {d.get('sil')!r}")
        return cls(phones, {int(k): v for k, v in d["roots"].items()}, int(d["num_leaves"]),
                   d.get("sil", SIL))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": CONTEXT_KIND, "phones": list(self.phones), "sil": self.sil,
                "num_leaves": self.num_leaves,
                "roots": {str(k): v for k, v in sorted(self.roots.items())}}

    @property
    def phone_id(self) -> dict[str, int]:
        return {p: i for i, p in enumerate(self.phones)}

    @property
    def center_phones(self) -> list[str]:
        """The phones that have classes (silence included)."""
        return [self.phones[p] for p in sorted(self.roots)]

    def leaf_ids(self, left: int, phone: int, right: int) -> int:
        node = self.roots.get(phone)
        if node is None:
            raise ContextTreeError(f"phone {self.phones[phone]!r} has no classes in the tree")
        while not isinstance(node, int):
            key, yes_set, yes, no = node
            node = yes if (left if key == 0 else right) in yes_set else no
        return node

    def leaf(self, left: str, phone: str, right: str) -> int:
        ids = self.phone_id
        return self.leaf_ids(ids[left], ids[phone], ids[right])

    @property
    def leaf_phone(self) -> list[str]:
        out = [""] * self.num_leaves

        def walk(node: Any, phone: str) -> None:
            if isinstance(node, int):
                out[node] = phone
            else:
                walk(node[2], phone)
                walk(node[3], phone)

        for p, node in self.roots.items():
            walk(node, self.phones[p])
        return out

    @property
    def leaf_center(self) -> np.ndarray:
        """[classes] each class's central phone, as an index into `center_phones`."""
        index = {p: i for i, p in enumerate(self.center_phones)}
        return np.array([index[p] for p in self.leaf_phone], np.int64)

    @property
    def context_free(self) -> bool:
        """No question asked: one leaf per phone, whatever its neighbours (the demo's tree
        at 27 labeled minutes); such classes are phone classes under other names."""
        return all(isinstance(node, int) for node in self.roots.values())

    def phone_tree(self) -> "ContextTree":
        """The same tree with no question asked: one leaf per central phone, numbered in
        `center_phones` order, so a leaf of this tree maps to its leaf there by
        `leaf_center` (train.grow's phone stage trains on it)."""
        roots = {p: i for i, p in enumerate(sorted(self.roots))}
        return ContextTree(list(self.phones), roots, len(roots), self.sil)

    @property
    def class_names(self) -> list[str]:
        return [f"{p}/{i}" for i, p in enumerate(self.leaf_phone)]


def silence_class(class_names: list[str], sil: str = SIL) -> int:
    """The silence class's id among class names: phone classes ("sil") or a network tree's
    leaves ("sil/<leaf>": silence is one leaf); -1 when there is none."""
    for i, name in enumerate(class_names):
        if name == sil or name.startswith(sil + "/"):
            return i
    return -1


def fit_frames(labels: np.ndarray, num_frames: int, tolerance: int
               ) -> tuple[np.ndarray | None, str]:
    """`labels` (one per 10 ms frame of the aligner's front end) fitted to `num_frames`."""
    diff = len(labels) - num_frames
    if abs(diff) > tolerance or len(labels) == 0:
        return None, (f"the alignment has {len(labels)} frames, the features {num_frames} "
                      f"(tolerance {tolerance})")
    if diff >= 0:
        return labels[:num_frames], ""
    return np.concatenate([labels, np.full(-diff, labels[-1], labels.dtype)]), ""
