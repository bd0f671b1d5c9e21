"""Pseudo-labels for end-to-end students: `pseudolabel.*` (amflow/steps/pseudolabel.py)."""
from __future__ import annotations

from dataclasses import dataclass

from core.config.errors import check


@dataclass
class PseudolabelConfig:
    """`amflow pseudolabel`: the teacher decodes the run's unlabeled selection (the search
    keys are decode.*: beam, max_active, sil_prob, acwt, workers); a confidence threshold
    chosen on dev keeps the confident hypotheses (decoding/pseudolabel.py)."""

    split: str = "unlabeled"  # the split of the run's selection (select shards) to label
    dev_split: str = "dev"  # data.corpus split (transcribed) choosing acwt and the threshold
    max_wer_ratio: float = 0.7  # rule: lowest threshold with kept dev WER <= this x unfiltered
    min_kept: float = 0.6  # ... keeping >= this share of dev audio (else its lowest kept WER)
    threshold: float = -1.0  # >= 0: this confidence threshold instead of the dev rule's

    def validate(self, key: str) -> None:
        check(bool(self.split) and self.split != "test", f"{key}.split",
              "must name a split of the run's selection other than test")
        check(self.dev_split in ("dev", "labeled"), f"{key}.dev_split",
              "must be dev or labeled (never test)")
        check(self.dev_split != self.split, f"{key}.dev_split",
              "must differ from pseudolabel.split")
        check(0 < self.max_wer_ratio <= 1, f"{key}.max_wer_ratio", "must be in (0, 1]")
        check(0 <= self.min_kept <= 1, f"{key}.min_kept", "must be in [0, 1]")
        check(self.threshold < 0 or self.threshold <= 1, f"{key}.threshold",
              "must be < 0 (choose on dev) or a confidence in [0, 1]")
