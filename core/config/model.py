"""The networks: `model.*` (the teacher's and the student's shapes)."""
from __future__ import annotations

from dataclasses import dataclass, field

from core.config.errors import check

@dataclass
class StudentConfig:
    layers: int = 2  # unidirectional LSTM layers
    hidden: int = 128  # LSTM cells per layer
    lookahead: int = 3  # frames of input read before each output (the output is delayed by them)
    dropout: float = 0.0  # on the inputs, between layers and before the output layer

    def validate(self, key: str) -> None:
        check(self.layers >= 1, f"{key}.layers", "must be >= 1")
        check(self.hidden >= 1, f"{key}.hidden", "must be >= 1")
        check(self.lookahead >= 0, f"{key}.lookahead", "must be >= 0")
        check(0 <= self.dropout < 1, f"{key}.dropout", "must be in [0, 1)")


@dataclass
class TeacherConfig:
    layers: int = 2  # bidirectional LSTM layers
    hidden: int = 128  # LSTM cells per layer and direction
    dropout: float = 0.0  # between layers

    def validate(self, key: str) -> None:
        check(self.layers >= 1, f"{key}.layers", "must be >= 1")
        check(self.hidden >= 1, f"{key}.hidden", "must be >= 1")
        check(0 <= self.dropout < 1, f"{key}.dropout", "must be in [0, 1)")


@dataclass
class ModelConfig:
    student: StudentConfig = field(default_factory=StudentConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    # 0 = the run's phone inventory size; a larger number (e.g. 3183 senones) in config.
    num_classes: int = 0
