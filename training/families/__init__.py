"""Model families: one interface (training/families/base.py: ModelFamily) and a registry by
name. Each family is one file here, registered with `@register_family("<name>")`; the
import below loads the built-in ones (docs/how-to/add-a-model-family.md)."""
from training.families.base import (DECODERS, ModelFamily, TorchStream, family_names,
                                    family_of, get_family, register_family)
from training.families import conformer, ctc, lstm  # noqa: F401  (registers the built-in families)

__all__ = ["DECODERS", "ModelFamily", "TorchStream", "family_names", "family_of", "get_family",
           "register_family"]
