"""docs/how-to/own-corpus.md, verbatim: its mine.yaml and its commands, on an 8 kHz
Kaldi-format corpus of three splits made here with espeak-ng (its own words, no lexicon),
from `amflow import` to a WER. The only additions are the tiny model settings below."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import soundfile as sf

from tests.own_corpus_data import make_kaldi_corpus

ROOT = Path(__file__).resolve().parents[1]
HOWTO = ROOT / "docs" / "how-to" / "own-corpus.md"
# Seconds, not minutes: small GMMs, a one-layer network, two epochs, one decode worker.
TINY = ["align.use_ray=false", "align.mono_iters=4", "align.tri_iters=2",
        "align.num_senones=100", "align.tri_gauss=300", "align.mono_gauss=200",
        "align.min_leaf_count=20", "model.teacher.layers=1", "model.teacher.hidden=32",
        "train.epochs=2", "train.finetune_epochs=0", "train.minibatch_frames=256",
        "train.chunk_frames=16", "decode.workers=1", "decode.acwt=[0.3,0.6]"]


# The semi-supervised recipe's students and the CTC student at the same toy size.
TINY_SSL = [*TINY, "model.student.layers=1", "model.student.hidden=32", "model.ctc.layers=1",
            "model.ctc.hidden=32", "train.sub_epochs=1", "train.unlabeled_passes=1",
            "train.ctc_preset={epochs: 2, finetune_epochs: 0}",
            "train.teacher_preset={epochs: 2}", "decode.ctc_lm_weights=[2.0]",
            "decode.blank_penalties=[1.5]", "targets.actors=1"]


def howto_blocks(which: int = 0) -> tuple[str, list[list[str]]]:
    """The page's mine.yaml and the commands of its `which`-th bash block (continuation
    lines joined, comments left out: the first line says this test runs it), as argv:
    0 the supervised path, 1 the semi-supervised one."""
    text = HOWTO.read_text()
    (yaml_block,) = re.findall(r"```yaml\n(.*?)```", text, re.S)
    bash_block = re.findall(r"```bash\n(.*?)```", text, re.S)[which]
    joined = bash_block.replace("\\\n", " ")
    assert bash_block.startswith("# run by tests/test_own_corpus.py\n"), bash_block[:80]
    commands = [argv for line in joined.splitlines() if (argv := shlex.split(line, comments=True))]
    assert all(c[0] == "amflow" for c in commands)
    return yaml_block, commands


def test_howto_commands_are_what_this_test_runs():
    yaml_block, commands = howto_blocks()
    assert [c[1] for c in commands] == ["import", "select", "align", "features",
                                        "repartition", "train", "lm", "decode"]
    assert "g2p: espeak" in yaml_block and "sample_rate: 8000" in yaml_block
    _, ssl = howto_blocks(1)
    assert [c[1] for c in ssl] == ["import", "run"] and ssl[1][2] == "ssl"


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.isolated  # amflow starts its Ray here, in the how-to's folder (relative paths)
def test_own_corpus_recipe_from_kaldi_dirs_to_wer(tmp_path, monkeypatch):
    from amflow.cli import SUMMARY_PREFIX, main

    monkeypatch.chdir(tmp_path)
    counts = make_kaldi_corpus(tmp_path / "kaldi", rate=8000)
    yaml_block, commands = howto_blocks()
    (tmp_path / "mine.yaml").write_text(yaml_block)
    for argv in commands:
        sets = [] if argv[1] == "import" else [a for s in TINY for a in ("--set", s)]
        assert main(argv[1:] + sets) == 0, " ".join(argv)
    corpus = tmp_path / "mine" / "corpus"
    summary = json.loads((corpus / "_SUCCESS.json").read_text())
    assert summary["per_split"] == {"dev": counts["dev"], "labeled": counts["train"],
                                    "test": counts["test"]}
    for src in summary["sources"].values():
        assert src["counts"]["in"] == src["counts"]["out"] + src["counts"]["rejected"]
    # 8 kHz kept as it is; a lexicon made for the corpus's own words
    rec = json.loads(next((corpus / "metadata").rglob("*.jsonl")).read_text().splitlines()[0])
    assert sf.info(rec["audio_uri"]).samplerate == 8000
    assert summary["lexicon"]["g2p_words"] >= 10 and (corpus / "lexicon_g2p.txt").exists()
    run = tmp_path / "mine" / "runs" / "mine"
    lm = json.loads((run / "lm" / "_SUCCESS.json").read_text())["metrics"]
    assert lm["text"]["source"] == "corpus" and lm["text"]["transcripts_labeled"] == \
        counts["train"]
    wer = json.loads((tmp_path / "mine" / "wer.json").read_text())
    assert 0.0 <= wer["wer"] <= 1.5 and wer["split"] == "test" and wer["tuning"]
    assert not wer["rejected"]
    # mine.yaml names no size: the corpus's hours chose one, the training says which and why
    size = json.loads((run / "train" / "_SUCCESS.json").read_text())["model_size"]
    assert size["size"] == "small" and size["why"].startswith("auto: ")


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.isolated  # amflow starts its Ray here, in the how-to's folder (relative paths)
def test_own_corpus_semi_supervised_in_two_commands(tmp_path, monkeypatch, capsys):
    """The page's semi-supervised commands verbatim: a train dir whose untranscribed
    utterances are the unlabeled audio -> teacher, baseline, SSL and CTC students, compared."""
    from amflow.cli import main

    monkeypatch.chdir(tmp_path)
    counts = make_kaldi_corpus(tmp_path / "kaldi", rate=8000, utts={"train": 12, "dev": 4,
                                                                     "test": 4},
                               transcribed=0.5)
    yaml_block, commands = howto_blocks(1)
    (tmp_path / "mine.yaml").write_text(yaml_block)
    assert main(commands[0][1:]) == 0, " ".join(commands[0])
    corpus = json.loads((tmp_path / "mine" / "corpus" / "_SUCCESS.json").read_text())
    assert corpus["per_split"]["unlabeled"] == counts["untranscribed"] > 0
    sets = [a for s in TINY_SSL for a in ("--set", s)]
    assert main(commands[1][1:] + sets) == 0, " ".join(commands[1])
    out = capsys.readouterr().out
    runs = tmp_path / "mine" / "runs"
    for run, folders in {"mine-ssl-teacher": ["train-teacher", "train-baseline",
                                              "decode-teacher", "decode-baseline"],
                         "mine-ssl-ssl": ["targets", "pseudolabel", "train", "train-ctc",
                                          "decode", "decode-ctc"]}.items():
        for folder in folders:
            assert (runs / run / folder / "_SUCCESS.json").is_file(), f"{run}/{folder}"
    ssl = json.loads((runs / "mine-ssl-ssl" / "targets" / "_SUCCESS.json").read_text())
    assert ssl["counts"]["out"] > 0  # the teacher labelled the untranscribed audio
    assert re.search(r"^\| mine-ssl-ssl \| decode \| [0-9.]+ \|.*vs decode-baseline", out,
                     re.M), out[-3000:]
    assert json.loads((runs / "mine-ssl-ssl" / "_run.json").read_text())["config"] == \
        str(tmp_path / "mine.yaml")
    # one size for both runs (chosen from the corpus, kept per run), said by each training
    sizes = {run: json.loads((runs / run / "_size.json").read_text())["size"]
             for run in ("mine-ssl-teacher", "mine-ssl-ssl")}
    assert set(sizes.values()) == {"small"}, sizes
    teacher = json.loads((runs / "mine-ssl-teacher" / "train-teacher" / "_SUCCESS.json")
                         .read_text())
    assert teacher["model_size"]["why"].startswith("auto: ") and "-> small" in out
    assert re.search(r"^ *amflow train: .*; model size auto: [0-9.]+ h transcribed", out, re.M)
