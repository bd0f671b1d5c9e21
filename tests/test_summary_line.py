"""The human line before AMFLOW_SUMMARY: headline metrics as percentages (WER with its
CI), counts, wall time; the JSON line stays the last and parses as before."""
from __future__ import annotations

import json

from amflow.summary_line import human_summary

DECODE = {"step": "decode", "wall_s": 12.34, "counts": {"in": 364, "out": 360, "rejected": 4},
          "metrics": {"wer": 0.1661, "wer_ci95": [0.1423, 0.1871], "ser": 0.5,
                      "per_condition_wer": {"DP1": 0.1}, "acwt": 0.1}}


def test_decode_line_has_wer_as_percent_with_ci():
    assert human_summary("decode", DECODE) == (
        "amflow decode: WER 16.6 % (95 % CI 14.2-18.7), SER 50.0 %, 364 in, 360 out, "
        "4 rejected, 12.3 s")


def test_other_steps_and_odd_summaries():
    assert human_summary("evaluate", {"metrics": {"frame_accuracy": 0.75, "per": 0.25},
                                      "wall_s": 3}) == "amflow evaluate: FA 75.0 %, PER 25.0 %, 3.0 s"
    assert human_summary("train", {"metrics": {"wer_ci95": [0.1, 0.2]}}) == "amflow train: done"
    assert human_summary("x", {"metrics": "odd", "counts": None}) == "amflow x: done"


def fake_step(ctx, args):
    return {"step": "decode", **{k: v for k, v in DECODE.items() if k != "step"}}


def test_cli_prints_it_just_before_the_json_line(monkeypatch, capsys):
    from amflow import cli
    from amflow.jobs.naming import parse_summary

    monkeypatch.setitem(cli.STEPS, "fakestep", cli.Step(
        entry="tests.test_summary_line:fake_step", help="", reads="", writes="",
        needs_run=False, in_a_run=False))
    assert cli.main(["fakestep", "--config", "configs/local.yaml"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-2] == "amflow fakestep: " + human_summary("decode", DECODE).split(": ", 1)[1]
    assert lines[-1].startswith("AMFLOW_SUMMARY ")
    assert json.loads(lines[-1][len("AMFLOW_SUMMARY "):]) == parse_summary("\n".join(lines)) \
        == fake_step(None, None)
