"""Kaldi files of a trained alignment model.

    tree_bytes(ctx_dep)   Kaldi binary `tree` (what `copy-tree`/`gmm-init-model` read/write)
    model_text(tm, am)    Kaldi text `final.mdl`: TransitionModel then AmDiagGmm
                          (`gmm-copy --binary=true` makes it binary; kaldi-hmm-gmm writes only
                          the TransitionModel's text form, the AmDiagGmm part is written here)
    matrix_text(m)        Kaldi text matrix (the LDA + MLLT `final.mat`)
    matrix_archive(ms)    Kaldi text archive of matrices (the per-speaker fMLLR `trans.ark`)
    pickled(...)          the objects through kaldi-hmm-gmm's own pickle hooks, for Python use
"""
from __future__ import annotations

import pickle

import kaldi_hmm_gmm as khg  # first: see alignment/__init__.py
import numpy as np


def tree_bytes(ctx_dep: khg.ContextDependency) -> bytes:
    body = np.asarray(ctx_dep.__getstate__()[0], np.int8).tobytes()  # Kaldi binary Write
    return b"\0B" + body


def _vec(v: np.ndarray) -> str:
    return " [ " + " ".join(f"{x:.7g}" for x in np.asarray(v).ravel()) + " ]\n"


def _mat(m: np.ndarray) -> str:
    rows = ["  " + " ".join(f"{x:.7g}" for x in r) for r in np.asarray(m)]
    return " [\n" + " \n".join(rows) + " ]\n"


def am_text(am: khg.AmDiagGmm) -> str:
    out = [f"<DIMENSION> {am.dim} <NUMPDFS> {am.num_pdfs} "]
    for j in range(am.num_pdfs):
        g = am.get_pdf(j)
        out.append("<DiagGMM> \n<GCONSTS> " + _vec(g.gconsts) + "<WEIGHTS> " + _vec(g.weights)
                   + "<MEANS_INVVARS> " + _mat(g.means_invvars) + "<INV_VARS> "
                   + _mat(g.inv_vars) + "</DiagGMM> \n")
    return "".join(out)


def matrix_text(m: np.ndarray) -> str:
    """A Kaldi text matrix (`copy-matrix` reads it)."""
    return _mat(m).lstrip()


def matrix_archive(matrices: dict[str, np.ndarray]) -> str:
    """A Kaldi text archive of matrices, one per key (`copy-matrix ark:- ark,t:-` form)."""
    return "".join(f"{key}  {_mat(m).lstrip()}" for key, m in sorted(matrices.items()))


def model_text(tm: khg.TransitionModel, am: khg.AmDiagGmm) -> str:
    return str(tm) + am_text(am)


def pickled(tree: khg.ContextDependency, tm: khg.TransitionModel, am: khg.AmDiagGmm) -> bytes:
    return pickle.dumps({"tree": tree, "transition_model": tm, "acoustic_model": am})
