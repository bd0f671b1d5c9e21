"""scripts/demo_floor.py: the floor is the longest path of step walls, skipped steps out."""
from __future__ import annotations

import importlib.util
import json

from tests.conftest import ROOT

spec = importlib.util.spec_from_file_location("demo_floor", ROOT / "scripts" / "demo_floor.py")
demo_floor = importlib.util.module_from_spec(spec)
spec.loader.exec_module(demo_floor)


def test_longest_path_of_step_walls_skips_steps_that_never_ran(tmp_path):
    for step, wall in {"select": 1, "features": 10, "lm": 30, "train-teacher": 100,
                       "decode-teacher": 5}.items():
        (tmp_path / step).mkdir()
        (tmp_path / step / "_SUCCESS.json").write_text(json.dumps({"wall_s": wall}))
    edges = [("select", "features"), ("features", "train"), ("select", "lm"),
             ("train", "decode"), ("lm", "decode"), ("train", "sequence_teacher")]
    walls = demo_floor.step_walls(tmp_path, {
        "select": "select", "features": "features", "lm": "lm", "train": "train-teacher",
        "decode": "decode-teacher", "sequence_teacher": "sequence-teacher"})
    assert walls == {"select": 1, "features": 10, "lm": 30, "train": 100, "decode": 5}
    # select -> features -> train -> decode (116) beats select -> lm -> decode (36);
    # sequence_teacher (skipped: no _SUCCESS.json) is not on any path
    assert demo_floor.longest_path(walls, edges, "select") == 116
