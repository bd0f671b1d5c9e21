"""Acoustic models by family (training/families/): the names the rest of amflow has
always imported from here, and the family-agnostic helpers (build, spec, class count).

A model's family picks everything kind-specific; this module only dispatches by name:
`build_model(kind, ...)` -> get_family(kind).build, `model_spec(model)` -> the kind, the
spec format and the family's spec, `model_from_spec(spec)` -> get_family(spec["kind"]).
"""
from __future__ import annotations

from typing import Any, Sequence

from torch import nn

from core.config import ModelConfig
from training.families import family_of, get_family
from training.families.lstm import (StudentLSTM, TeacherBLSTM, _LSTMBody,  # noqa: F401
                                    lstm_layer_template, lstm_parameter_count)

SPEC_FORMAT = 1


def resolve_num_classes(model_cfg: ModelConfig, phones: Sequence[str] | None,
                        tree_leaves: bool = False) -> int:
    """`model.num_classes`, or the run's class count (phones.json) when it is 0. When the
    classes are a network tree's leaves (`tree_leaves`: features.labels=align) a set
    model.num_classes must be their count: outputs beyond the leaves would be classes no
    frame is labelled with and no phone stands for (evaluate and decode read a class as
    its leaf's phone)."""
    n = model_cfg.num_classes
    if n > 0 and tree_leaves and phones and n != len(phones):
        raise ValueError(f"model.num_classes={n}, but this run's classes are the {len(phones)} "
                         "leaves of its network tree (align.nn_senones is the most it builds; "
                         f"the data split into {len(phones)}): set model.num_classes to 0, the "
                         "tree's leaf count")
    if n > 0:
        if phones and n < len(phones):
            raise ValueError(f"model.num_classes={n} is smaller than the "
                             f"run's phone inventory ({len(phones)} phones)")
        return int(n)
    if not phones:
        raise ValueError("model.num_classes is 0 and the run has no phone inventory")
    return len(phones)


def build_model(kind: str, input_dim: int, num_classes: int, model_cfg: ModelConfig,
                stack: int = 3) -> nn.Module:
    """A fresh model of family `kind` ('student', 'teacher', 'ctc', or any registered);
    sizes come from `model_cfg` (config.model); `stack` (features.stack) is how a model
    that reads fbank frames (the CTC student) unstacks its input."""
    return get_family(kind).build(input_dim, num_classes, model_cfg, stack)


def model_spec(model: nn.Module) -> dict[str, Any]:
    """What is needed to rebuild `model` from a checkpoint (plain JSON types)."""
    family = family_of(model)
    return {"format": SPEC_FORMAT, "kind": family.name, **family.spec(model)}


def model_from_spec(spec: dict[str, Any]) -> nn.Module:
    try:
        family = get_family(spec["kind"])
    except ValueError as e:
        raise ValueError(f"{e} in model spec") from None
    return family.from_spec(spec)


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
