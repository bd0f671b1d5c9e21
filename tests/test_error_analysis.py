"""sclite-like alignment lines, confusion pairs and S/D/I counts on hand-made rows."""
from decoding import error_analysis as E

ROWS = [
    {"utt_id": "u1", "condition": "DP1", "ref": "the cat sat", "hyp": "the bat sat down"},
    {"utt_id": "u2", "condition": "DP2", "ref": "a cat ran home", "hyp": "a bat home"},
    {"utt_id": "u3", "condition": "DP2", "ref": "yes", "hyp": "yes"},
]


def test_align_ops():
    ops = [op for _, _, op in E.align("the cat sat".split(), "the bat sat down".split())]
    assert ops == ["C", "S", "C", "I"]


def test_alignment_lines_mark_errors():
    text = E.alignment_lines(ROWS[0])
    ref, hyp, ev = text.splitlines()[1:4]
    assert ref.split() == ["REF:", "the", "CAT", "sat", "****"]
    assert hyp.split() == ["HYP:", "the", "BAT", "sat", "DOWN"]
    assert ev.split() == ["Eval:", "S", "I"]


def test_analyse_counts_and_confusions():
    a = E.analyse(ROWS)
    assert a["per_condition"]["DP1"] == {"ref_words": 3, "sub": 1, "del": 0, "ins": 1,
                                         "cor": 2, "wer": 2 / 3}
    dp2 = a["per_condition"]["DP2"]
    assert (dp2["sub"], dp2["del"], dp2["ins"], dp2["ref_words"]) == (1, 1, 0, 5)
    assert a["errors"]["sub"] == 2 and a["errors"]["ref_words"] == 8
    assert a["confusions"][0] == {"ref": "cat", "hyp": "bat", "count": 2}
    assert a["deleted"] == [{"word": "ran", "count": 1}]
    assert a["inserted"] == [{"word": "down", "count": 1}]
    assert "cat -> bat: 2" in E.render(ROWS)


def test_result_fields_for_decode_out():
    rows = [dict(r, errors=e, ref_words=n) for r, e, n in zip(ROWS, [2, 2, 0], [3, 4, 1])]
    f = E.result_fields(rows)
    lo, hi = f["wer_ci95"]
    assert lo <= 4 / 8 <= hi
    assert set(f["per_condition_ci95"]) == {"DP1", "DP2"}
    assert f["per_condition_ci95"]["DP1"] == [2 / 3, 2 / 3]  # one utterance: no spread
    assert (f["errors"]["sub"], f["errors"]["del"], f["errors"]["ins"]) == (2, 1, 1)
