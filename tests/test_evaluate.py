"""`amflow evaluate`: scoring maths, and a corpus -> features -> model -> report round trip."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest
import soundfile as sf
import torch

from core import records
from amflow.cli import SUMMARY_PREFIX, main
from core.runs import StepContext
from core.storage import Storage, join
from amflow.steps import train as train_step
from training.data import cmvn_stats, rows_table
from training.evaluate import (UttScore, aggregate, collapse, edit_distance,
                               edit_distance_variants, relative_error_reduction,
                               score_transcript, score_utterance)
from tests.conftest import ROOT

torch.set_num_threads(1)


def _levenshtein(a, b):
    d = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1,
                          d[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
    return d[-1][-1]


def test_collapse_and_edit_distance():
    assert collapse([3, 3, 1, 1, 1, 3, 2, 2]).tolist() == [3, 1, 3, 2]
    assert collapse([]).tolist() == []
    rng = random.Random(0)
    for _ in range(200):
        a = [rng.randrange(4) for _ in range(rng.randrange(0, 12))]
        b = [rng.randrange(4) for _ in range(rng.randrange(0, 12))]
        assert edit_distance(a, b) == _levenshtein(a, b)


def test_edit_distance_over_pronunciation_variants():
    rng = random.Random(1)
    for _ in range(200):  # one variant per word: the plain distance to their concatenation
        words = [[tuple(rng.randrange(4) for _ in range(rng.randrange(1, 4)))]
                 for _ in range(rng.randrange(0, 5))]
        hyp = [rng.randrange(4) for _ in range(rng.randrange(0, 12))]
        ref = [p for w in words for p in w[0]]
        assert edit_distance_variants(hyp, words) == (_levenshtein(hyp, ref), len(ref))
    for _ in range(200):  # several: the best choice per word, and that choice's length
        words = [[tuple(rng.randrange(4) for _ in range(rng.randrange(1, 4)))
                  for _ in range(rng.randrange(1, 3))] for _ in range(rng.randrange(1, 4))]
        hyp = [rng.randrange(4) for _ in range(rng.randrange(0, 10))]
        spellings = [[p for v in choice for p in v] for choice in _choices(words)]
        best = min((_levenshtein(hyp, r), len(r)) for r in spellings)
        assert edit_distance_variants(hyp, words) == best


def _choices(words):
    if not words:
        return [[]]
    return [[v] + rest for v in words[0] for rest in _choices(words[1:])]


def test_score_transcript_is_per_without_silence_and_no_frames():
    sil = 9
    words = [[(0, 1)], [(2,), (3, 3)]]  # "0 1" then "2" or "3 3"
    s = score_transcript(np.array([sil, 0, 0, 1, sil, 3, 3, 1, sil]), words, "DP2", sil)
    # hyp "0 1 3 1" (collapsed, silence out) vs "0 1 3 3": 1 edit; vs "0 1 2": 2
    assert (s.frames, s.ref_phones, s.edits, s.ref_speech, s.edits_speech) == (0, 4, 1, 4, 1)
    r = aggregate([s])
    assert r["frame_accuracy"] is None and r["per_condition"] == {"DP2": None}
    assert r["per"] == r["per_speech"] == pytest.approx(0.25)


def test_score_utterance_frames_and_collapsed_phones():
    ref = np.array([0, 0, 1, 1, 2, 2])
    s = score_utterance(np.array([0, 0, 1, 2, 2, 2]), ref, "DP1")
    assert (s.frames, s.correct, s.ref_phones, s.edits) == (6, 5, 3, 0)  # same phone string
    s = score_utterance(np.array([0, 2, 1, 1, 2, 2]), ref, "DP1")
    assert (s.correct, s.edits) == (5, 1)  # "0 2 1 2" vs "0 1 2": one insertion
    with pytest.raises(ValueError):
        score_utterance(np.zeros(5), ref, "DP1")


def test_per_without_silence():
    sil = 9
    ref = np.array([sil, sil, 0, 0, sil, 1, 1, sil])  # "sil 0 sil 1 sil"
    s = score_utterance(np.array([sil, 2, 0, 0, 0, 1, 1, 1]), ref, "DP1", silence=sil)
    assert (s.ref_phones, s.edits) == (5, 3)  # "sil 2 0 1" vs "sil 0 sil 1 sil"
    assert (s.ref_speech, s.edits_speech) == (2, 1)  # "2 0 1" vs "0 1": one insertion
    s = score_utterance(np.array([0, 0, 0, 0, sil, 1, 1, 1]), ref, "DP1", silence=sil)
    assert s.edits == 2 and s.edits_speech == 0  # only silence missed
    r = aggregate([s, UttScore("DP1", 8, 8, 5, 0, 2, 0)])
    assert r["per_speech"] == 0.0 and r["per"] == pytest.approx(2 / 10)
    assert r["per_condition_per_speech"] == {"DP1": 0.0}


def test_aggregate_and_relative_reduction():
    scores = [UttScore("DP1", 10, 9, 4, 1), UttScore("DP1", 10, 7, 4, 0),
              UttScore("DP5", 20, 10, 8, 4)]
    r = aggregate(scores)
    assert r["frame_accuracy"] == pytest.approx(26 / 40) and r["num_frames"] == 40
    assert r["per_condition"] == {"DP1": pytest.approx(0.8), "DP5": pytest.approx(0.5)}
    assert r["per_condition_per"] == {"DP1": pytest.approx(1 / 8), "DP5": pytest.approx(0.5)}
    assert r["per"] == pytest.approx(5 / 16) and r["num_utterances"] == 3
    red = relative_error_reduction({"DP1": 0.8, "DP5": 0.5}, {"DP1": 0.9, "DP5": 0.5})
    assert red == {"DP1": pytest.approx(0.5), "DP5": 0.0}


# ---------------------------------------------------------------- a tone "speech" corpus
PHONES = ["a", "e", "i", "o", "u", "s"]
FREQS = [300.0, 550.0, 900.0, 1400.0, 2100.0, 3200.0]
SR = 16000


def _utterance(rng, snr_db):
    segs, t, wave = [], 0.0, []
    prev = -1
    while t < rng.uniform(0.9, 1.4):
        p = int(rng.integers(len(PHONES)))
        if p == prev:
            continue
        dur = round(float(rng.uniform(0.06, 0.15)), 3)
        n = int(round(dur * SR))
        tt = np.arange(n) / SR
        envelope = 1 + 0.3 * np.sin(2 * np.pi * 3 * tt)
        wave.append(0.3 * np.sin(2 * np.pi * FREQS[p] * tt) * envelope)
        segs.append((t, dur, PHONES[p]))
        t += dur
        prev = p
    x = np.concatenate(wave)
    noise = rng.standard_normal(len(x)) * np.sqrt(np.mean(x**2) / 10 ** (snr_db / 10))
    return (x + noise).astype(np.float32), segs


def _write_corpus(root, rng):
    """Speakers s0..s2 train (labeled), t0..t1 test in DP1 and DP3; two bad test records."""
    meta, ctm, train = [], [], []
    for spk, split, n in [("s0", "labeled", 10), ("s1", "labeled", 10), ("s2", "labeled", 10),
                          ("t0", "test", 6), ("t1", "test", 6)]:
        for i in range(n):
            cond = "DP1" if i % 2 == 0 else "DP3"
            x, segs = _utterance(rng, 30.0 if cond == "DP1" else 8.0)
            utt = f"{spk}-{i:02d}"
            sf.write(str(root / "audio" / f"{utt}.wav"), x, SR, subtype="PCM_16")
            meta.append({"utt_id": utt, "speaker_id": spk, "duration": len(x) / SR,
                         "created_at": f"2024-01-01T00:{i:02d}:00", "locale": "en-US",
                         "audio_uri": f"audio/{utt}.wav", "condition": cond, "split": split,
                         "text": " ".join(f"w{p}" for _, _, p in segs)})  # word wX: phone X
            ctm += [f"{utt} 1 {s:.3f} {d:.3f} {p}" for s, d, p in segs]
            if split == "labeled":
                train.append((spk, x, segs, cond, utt))
    meta.append({"utt_id": "t9-missing-audio", "speaker_id": "t9", "duration": 1.0,
                 "created_at": "2024-01-01T00:00:00", "locale": "en-US",
                 "audio_uri": "audio/nope.wav", "condition": "DP1", "split": "test",
                 "text": "wa"})
    ctm.append("t9-missing-audio 1 0.000 0.500 a")
    meta.append(dict(meta[-2], utt_id="t0-no-ctm"))  # same audio, no alignment lines
    (root / "metadata.jsonl").write_text("".join(json.dumps(m) + "\n" for m in meta))
    (root / "alignments.ctm").write_text("\n".join(ctm) + "\n")
    return train


def _featurise_training_run(run_root, train, fcfg):
    """What select -> features -> repartition would write, via the same public functions."""
    from tasks import alignments as al
    from tasks.features import featurize_stream
    from tasks.fbank import FbankComputer

    inventory = PHONES + [al.UNK]
    ids = {p: i for i, p in enumerate(inventory)}
    computer = FbankComputer(fcfg)
    rows = []
    for spk in sorted({t[0] for t in train}):
        items = [t for t in train if t[0] == spk]
        feats = featurize_stream([t[1] for t in items], fcfg, computer)
        for (_, x, segs, cond, utt), f in zip(items, feats):
            starts = np.array([s for s, _, _ in segs])
            ends = np.array([s + d for s, d, _ in segs])
            pid = np.array([ids[p] for _, _, p in segs])
            n100 = computer.num_frames(len(x))
            fl, reason, _ = al.frame_labels_ids(starts, ends, pid, n100, fcfg)
            assert fl is not None, reason
            rows.append({"utt_id": utt, "speaker_id": spk, "split": "labeled", "condition": cond,
                         "shard": "s", **records.encode_feats(f, "float16"),
                         "labels": records.encode_int16(al.lfr_labels(fl, len(f), 3, 3)),
                         "frame_labels": records.encode_int16(fl)})
    st = Storage()
    tables = [rows_table(rows[0::2]), rows_table(rows[1::2])]
    for i, t in enumerate(tables):
        st.write_parquet(join(run_root, "repartition", "labeled", f"part-{i:05d}.parquet"), t)
    st.write_json(join(run_root, "features", "cmvn.json"), cmvn_stats(tables))
    st.write_json(join(run_root, "features", "phones.json"), inventory)
    for step in ("features", "repartition"):
        st.write_json(join(run_root, step, "_SUCCESS.json"), {"step": step})


def test_evaluate_a_trained_teacher_on_a_corpus(tmp_path, local_cfg, capsys):
    corpus = tmp_path / "corpus"
    (corpus / "audio").mkdir(parents=True)
    train = _write_corpus(corpus, np.random.default_rng(0))
    store = tmp_path / "store"
    cfg = local_cfg("train.model=teacher", "train.augment.enabled=false",  # no clean sources
                    "train.epochs=4", "train.finetune_epochs=1",
                    "train.lr=0.01", "train.final_lr=0.002", "train.minibatch_frames=512",
                    "model.teacher.layers=1", "model.teacher.hidden=32", "train.threads=1",
                    "model.teacher.dropout=0", "train.chunk_frames=32",
                    "train.checkpoint_every=1000")
    _featurise_training_run(str(store / "runs" / "r"), train, cfg.features)
    train_step.run(StepContext(cfg, "r", "train"), None)
    capsys.readouterr()
    out = tmp_path / "result.json"
    argv = ["evaluate", "--config", str(ROOT / "configs" / "local.yaml"), "--run-id", "r",
            "--data", str(corpus), "--split", "test", "--out", str(out),
            "--set", f"storage.root={store}"]
    assert main(argv + ["--set", f"evaluate.baseline={store}/runs/r/train/model.pt"]) == 0
    printed = capsys.readouterr().out
    summary = json.loads(printed.strip().splitlines()[-1][len(SUMMARY_PREFIX):])
    res = json.loads(out.read_text())
    assert set(res["per_condition"]) == {"DP1", "DP3"} and res["num_utterances"] == 12
    assert res["frame_accuracy"] > 0.8, res
    assert res["per_condition"]["DP1"] >= res["per_condition"]["DP3"] - 0.02
    assert 0 <= res["per"] < 0.5 and set(res["per_condition_per"]) == {"DP1", "DP3"}
    assert res["rejected"] == {"missing_audio": 1, "missing_alignment": 1}
    assert res["rel_frame_error_reduction"]["all"] == 0.0  # the baseline is the same model
    assert res["num_frames"] == sum(res["per_condition_frames"].values())
    success = json.loads((store / "runs" / "r" / "evaluate" / "_SUCCESS.json").read_text())
    assert success["counts"] == {"in": 14, "out": 12, "rejected": 2}
    assert summary["metrics"]["frame_accuracy"] == res["frame_accuracy"]
    assert "DP3" in printed  # the per-condition table
    # Run again on the same inputs: the finished evaluation is handed back (the result is
    # not rewritten); without the baseline, or with the model trained again, it is redone.
    out.write_text(json.dumps({**res, "untouched": True}))
    assert main(argv + ["--set", f"evaluate.baseline={store}/runs/r/train/model.pt"]) == 0
    assert json.loads(out.read_text())["untouched"]
    assert main(argv) == 0
    assert "untouched" not in json.loads(out.read_text())
    assert "rel_frame_error_reduction" not in json.loads(out.read_text())
    out.write_text(json.dumps({**res, "untouched": True}))
    model_pt = store / "runs" / "r" / "train" / "model.pt"
    model_pt.write_bytes(model_pt.read_bytes())  # written again, the same bytes: kept
    assert main(argv) == 0 and json.loads(out.read_text())["untouched"]
    trained = model_pt.read_bytes()
    saved = torch.load(model_pt, weights_only=False)  # trained again at the same URI
    _perturb(saved)
    torch.save(saved, model_pt)
    assert main(argv) == 0 and "untouched" not in json.loads(out.read_text())
    model_pt.write_bytes(trained)
    # the default --out and a tag: evaluate-<tag>/result.json, model from train-<tag>
    assert main(argv[:-4] + ["--set", f"storage.root={store}", "--set", "evaluate.tag=x",
                             "--model", str(store / "runs" / "r" / "train" / "model.pt")]) == 0
    again = json.loads((store / "runs" / "r" / "evaluate-x" / "result.json").read_text())
    assert again["frame_accuracy"] == res["frame_accuracy"]
    _evaluate_by_transcripts(tmp_path, corpus, argv, res)


def _perturb(saved) -> None:
    """Nudge the first weight tensor found in a saved model (what another training gives)."""
    stack = [saved]
    while stack:
        obj = stack.pop()
        values = obj.values() if isinstance(obj, dict) else []
        for v in values:
            if isinstance(v, torch.Tensor) and v.is_floating_point():
                v.add_(0.01)
                return
            stack.append(v)
    raise AssertionError("no weight tensor in the saved model")


def _evaluate_by_transcripts(tmp_path, corpus, argv, with_ctm):
    """The same test split in a corpus with no alignments.ctm (real transcribed speech):
    PER against the transcripts through the lexicon, no frame accuracy, bad records
    rejected with their reasons."""
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(corpus, bare)
    (bare / "alignments.ctm").unlink()
    (bare / "lexicon.txt").write_text("".join(f"w{p} {p}\n" for p in PHONES))
    meta = [json.loads(line) for line in (bare / "metadata.jsonl").read_text().splitlines()]
    meta += [dict(meta[-1], utt_id="t0-oov", text="wa wzz"),
             dict(meta[-1], utt_id="t0-silent", text="")]
    (bare / "metadata.jsonl").write_text("".join(json.dumps(m) + "\n" for m in meta))
    out = tmp_path / "bare.json"
    assert main(argv[:5] + ["--data", str(bare), "--split", "test", "--out", str(out)]
                + argv[-2:]) == 0
    res = json.loads(out.read_text())
    assert res["reference"] == "transcript" and res["frame_accuracy"] is None
    assert res["num_frames"] == 0 and set(res["per_condition_per"]) == {"DP1", "DP3"}
    assert res["num_utterances"] == 13  # t0-no-ctm has a transcript
    assert res["rejected"] == {"missing_audio": 1, "oov_word": 1, "no_transcript": 1}
    # the transcripts spell what the CTM holds: the same PER, give or take the one more
    # utterance (and its share of the speaker's running CMN)
    assert res["per_speech"] == pytest.approx(with_ctm["per_speech"], abs=0.05)


def test_align_labels_are_read_in_the_model_trees_classes():
    """A model of the run's own tree reads align's leaves as they are, one of its phone
    tree (train.grow's phone stage) reads them as their phones, any other tree none."""
    import numpy as np

    from core.senones import CONTEXT_KIND, ContextTree
    from training.evaluate import labels_in_model_classes

    tree = ContextTree.from_dict({
        "kind": CONTEXT_KIND, "phones": ["<eps>", "sil", "a", "b"], "sil": "sil",
        "num_leaves": 5, "roots": {"1": 0, "2": [0, [3], 1, 2], "3": [2, [2], 3, 4]}})
    labels = {"u1": np.array([0, 1, 2, 3, 4, 0], np.int16)}
    assert labels_in_model_classes(tree.to_dict(), tree, labels) is labels
    as_phones = labels_in_model_classes(tree.phone_tree().to_dict(), tree, labels)
    assert as_phones["u1"].tolist() == [0, 1, 1, 2, 2, 0]
    other = ContextTree(tree.phones, {1: 0, 2: 1, 3: [0, [2], 2, 3]}, 4, "sil")
    assert labels_in_model_classes(other.to_dict(), tree, labels) is None
