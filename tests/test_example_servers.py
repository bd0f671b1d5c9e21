"""Example servers: on-the-fly augmentation from clean sources, streamed into the trainer.

The fixture is a tiny run whose audio is real signal: "phones" are tones (class c at
300 (c+1) Hz with harmonics, `sil` a faint hiss), so features, labels and their timing
can be checked against each other, and a teacher can learn them.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from core import records
from core.config import load_config
from core.runs import StepContext
from core.storage import Storage, join
from amflow.steps import train as train_step
from tasks.corpus import wav_bytes
from tasks.features import featurize_stream
from training.checkpoint import load_model
from training.data import Normalizer, PassSpec, SplitIndex, plan_pass, rows_table
from training.example_servers import (ExampleServers, Recipe, Renderer, StreamItem,
                                      augmented_frames, draw_recipe, load_clean_sources,
                                      stretch_labels)
from training.loop import InjectedFailure
from training.schedules import plan_passes
from tests.conftest import ROOT

torch.set_num_threads(1)
FS = 16000
PHONES = ["sil", "a", "b", "c", "d", "e"]
TINY = ["train.threads=1", "train.minibatch_frames=256", "train.chunk_frames=16",
        "train.chunk_left_context=4", "train.lr=0.01", "train.final_lr=0.002",
        "train.log_every=4", "model.teacher.layers=1", "model.teacher.hidden=24",
        "model.teacher.dropout=0", "train.model=teacher", "train.regime=labeled",
        "train.epochs=3", "train.finetune_epochs=1", "train.checkpoint_every=5"]
AUG = ["train.augment.enabled=true", "train.augment.servers=0", "train.augment.stream_utts=3",
       "train.augment.window_streams=2", "train.augment.noises=pink,hum,clatter"]


def _tone_utterance(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Samples for F fbank frames (snip_edges) and the F frame labels (class at centre)."""
    segs, total = [], 0
    prev = -1
    while total < int(rng.integers(90, 160)):
        c = int(rng.integers(len(PHONES)))
        if c == prev:
            continue
        d = int(rng.integers(6, 16))
        segs.append((c, d))
        total, prev = total + d, c
    frames = total
    n = 400 + 160 * (frames - 1)
    cls = np.concatenate([np.full(d * 160, c) for c, d in segs])
    cls = np.concatenate([cls, np.full(n - len(cls), segs[-1][0])])[:n]
    t = np.arange(n) / FS
    x = 3e-3 * rng.standard_normal(n)
    for c in range(1, len(PHONES)):
        f0 = 300.0 * (c + 1)
        tone = 0.05 * (np.sin(2 * np.pi * f0 * t) + 0.5 * np.sin(4 * np.pi * f0 * t))
        x += np.where(cls == c, tone, 0.0)
    labels = cls[np.arange(frames) * 160 + 200].astype(np.int16)
    return x, labels


def make_tone_run(root: Path, utts: int = 18, speakers: int = 3, seed: int = 0) -> dict:
    """Corpus (clean WAVs + metadata with clean_audio_uri) and a run's features and
    repartition outputs for it, computed the features step's way (featurize_stream)."""
    st = Storage()
    fcfg = load_config(ROOT / "configs" / "local.yaml").features
    rng = np.random.default_rng(seed)
    corpus = root / "corpus"
    meta, rows = [], {"labeled": [], "dev": []}
    waves: dict[str, list] = {}
    for i in range(utts):
        spk = f"spk{i % speakers}"
        split = "dev" if i >= utts - speakers else "labeled"
        x, fl = _tone_utterance(rng)
        utt = f"{spk}-{i:04d}"
        rel = f"audio_clean/{split}/{spk}/{utt}.wav"
        pcm = np.clip(np.round(x * 32767), -32768, 32767).astype(np.int16)
        (corpus / rel).parent.mkdir(parents=True, exist_ok=True)
        (corpus / rel).write_bytes(wav_bytes(pcm, FS))
        meta.append({"utt_id": utt, "speaker_id": spk, "duration": len(x) / FS,
                     "created_at": f"2026-03-01T10:{i:02d}:00+00:00", "locale": "en-US",
                     "audio_uri": rel, "clean_audio_uri": rel, "split": split})
        waves.setdefault(spk, []).append((utt, split, pcm.astype(np.float32) / 32768.0, fl))
    (corpus / "metadata").mkdir(parents=True, exist_ok=True)
    (corpus / "metadata" / "part-0.jsonl").write_text("".join(json.dumps(m) + "\n" for m in meta))
    for spk, items in waves.items():  # one stream per speaker, in time order
        feats = featurize_stream([w for _, _, w, _ in items], fcfg)
        for (utt, split, _, fl), x in zip(items, feats):
            rows[split].append({"utt_id": utt, "speaker_id": spk, "split": split,
                                "condition": "DP1", "shard": "s",
                                **records.encode_feats(x, "float16"),
                                "labels": records.encode_int16(
                                    records.offset_labels(fl, 0, 3, x.shape[0])),
                                "frame_labels": records.encode_int16(fl)})
    run = join(str(root / "store"), "runs", "r")
    allx = np.concatenate([records.decode_feats(r).astype(np.float64) for r in rows["labeled"]])
    st.write_json(join(run, "features", "cmvn.json"), {
        "count": len(allx), "sum": allx.sum(0).tolist(), "sumsq": (allx ** 2).sum(0).tolist()})
    st.write_json(join(run, "features", "phones.json"), PHONES)
    st.write_json(join(run, "features", "_SUCCESS.json"), {"step": "features"})
    for split, parts in (("labeled", 2), ("dev", 1)):
        for p in range(parts):
            st.write_parquet(join(run, "repartition", split, f"part-{p:05d}.parquet"),
                             rows_table(rows[split][p::parts]))
    st.write_json(join(run, "repartition", "_SUCCESS.json"), {"step": "repartition"})
    return {"corpus": str(corpus), "run": run, "waves": waves, "fcfg": fcfg}


@pytest.fixture(scope="module")
def tone_run(tmp_path_factory):
    return make_tone_run(tmp_path_factory.mktemp("tones"))


def _cfg(tone_run, *overrides):
    root = Path(tone_run["run"]).parents[1]
    return load_config(ROOT / "configs" / "local.yaml",
                       [f"storage.root={root}", f"data.corpus={tone_run['corpus']}", *TINY,
                        *overrides])


def _servers(tone_run, *overrides) -> tuple[ExampleServers, list]:
    cfg = _cfg(tone_run, *AUG, *overrides)
    st = Storage()
    run = tone_run["run"]
    uris = sorted(st.list(join(run, "repartition", "labeled"), suffix=".parquet"))
    index = SplitIndex.load(st, uris, "labels", 48 * 4)
    norm = Normalizer.from_stats(st.read_json(join(run, "features", "cmvn.json")), 192)
    src = ExampleServers(st, cfg.train, cfg.features, index,
                         load_clean_sources(st, tone_run["corpus"]), 0, 3, 4, norm,
                         storage_cfg=cfg.storage, sil_id=0)
    return src, plan_passes(cfg.train, 3)


def _drain(src, p, start=0, limit=None):
    n = src.num_batches(p)
    stream = src.open(p, start, n if limit is None else limit)
    return [(b.x.clone(), b.labels.clone(), b.frames) for b in stream], stream


def _same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1])
                                    for x, y in zip(a, b))


def test_features_equal_the_features_step_when_augmentation_is_off(tone_run):
    """Identity recipes: the rendered rows are the features step's (fbank, causal CMN over
    the speaker's stream, LFR) after the global CMVN, at every frame offset."""
    fcfg = tone_run["fcfg"]
    items = tone_run["waves"]["spk1"]
    corpus = Path(tone_run["corpus"])
    norm = Normalizer(np.full(192, 0.5, np.float32), np.full(192, 2.0, np.float32))
    renderer = Renderer(Storage(), fcfg, norm)
    ref = featurize_stream([w for _, _, w, _ in items], fcfg)
    stream = [StreamItem(k, utt, str(corpus / f"audio_clean/{split}/spk1/{utt}.wav"), fl,
                         Recipe(seed=0)) for k, (utt, split, _, fl) in enumerate(items)]
    for offset in (0, 2):
        out, cpu = renderer.render_stream(stream, offset, 3)
        assert [r.pos for r in out] == list(range(len(items))) and cpu > 0
        for r, x, (_, _, _, fl) in zip(out, ref, items):
            want = norm(records.shift_offset(x, offset, 3))
            np.testing.assert_allclose(r.x, want, rtol=0, atol=1e-4)
            assert np.array_equal(r.labels, records.offset_labels(fl, offset, 3, len(want)))


def test_speed_perturbation_stretches_the_labels_with_the_audio(tone_run):
    """At 0.9x the utterance has 1/0.9 as many frames, and the stretched labels still
    name the tone that the sped audio holds in each frame."""
    fcfg = tone_run["fcfg"]
    utt, split, _, fl = tone_run["waves"]["spk0"][0]
    uri = str(Path(tone_run["corpus"]) / f"audio_clean/{split}/spk0/{utt}.wav")
    norm = Normalizer(np.zeros(192, np.float32), np.ones(192, np.float32))
    renderer = Renderer(Storage(), fcfg, norm)
    for speed in (0.9, 1.1):
        frames = augmented_frames(len(fl), speed, fcfg)
        assert abs(frames - len(fl) / speed) <= 2
        lab = stretch_labels(fl, speed, frames, fcfg)
        runs = np.diff(np.nonzero(np.diff(lab))[0])
        src_runs = np.diff(np.nonzero(np.diff(fl))[0])
        assert abs(runs.sum() / src_runs.sum() - 1 / speed) < 0.03
        # speed changes pitch too: tone class c moves to 300 (c+1) / speed Hz; the
        # loudest mel bin of each frame must follow the labels, not the source timing
        out, _ = renderer.render_stream([StreamItem(0, utt, uri, fl, Recipe(1, speed=speed))],
                                        0, 3)
        (r,) = out
        assert len(r.x) == (frames - 3) // 3 + 1 and len(r.labels) == len(r.x)
        peak = r.x.reshape(len(r.x), 3, 64)[:, 1].argmax(1)  # centre frame of each row
        by_class = {c: np.median(peak[r.labels == c]) for c in range(1, 6)
                    if (r.labels == c).sum() >= 3}
        assert list(by_class.values()) == sorted(by_class.values()) and len(by_class) >= 3
        for c, med in by_class.items():
            assert np.mean(np.abs(peak[r.labels == c] - med) <= 2) > 0.85


def test_a_pass_is_deterministic_per_seed_and_pass_and_differs_between_passes(tone_run):
    a, passes = _servers(tone_run)
    b, _ = _servers(tone_run)
    c, _ = _servers(tone_run, "train.seed=1")
    p0, p1 = passes[0], passes[1]
    ra, _ = _drain(a, p0)
    assert _same(ra, _drain(b, p0)[0])
    assert not _same(ra, _drain(c, p0)[0])
    assert not _same(ra, _drain(a, p1)[0])
    recipes = [draw_recipe(a.acfg, 0, p0.index, u.utt_id) for u in a.utts]
    assert len({r.condition or r.noise for r in recipes}) > 2 and {r.speed for r in recipes} > {1.0}


def test_stored_prob_keeps_the_corpus_rendering_and_leaves_the_other_draws(tone_run,
                                                                           tmp_path):
    """train.augment.stored_prob: that share of utterances is the corpus's own rendering
    (audio_uri) with only speed and VTLP; every other draw is the one stored_prob=0 makes,
    so the default recipes (and results) are unchanged."""
    base = _cfg(tone_run, *AUG, "train.augment.stored_prob=0").train.augment
    half = _cfg(tone_run, *AUG, "train.augment.stored_prob=0.5").train.augment
    ids = [f"u{i}" for i in range(200)]
    r0 = [draw_recipe(base, 0, 1, u) for u in ids]
    r5 = [draw_recipe(half, 0, 1, u) for u in ids]
    assert not any(r.stored for r in r0) and 70 < sum(r.stored for r in r5) < 130
    for a, b in zip(r0, r5):
        assert (b.seed, b.speed, b.warp) == (a.seed, a.speed, a.warp)
        assert (b.condition, b.noise) == (("", "") if b.stored else (a.condition, a.noise))
    # rendering: a stored recipe reads stored_uri, not the clean source
    fcfg = tone_run["fcfg"]
    utt, split, wave, fl = tone_run["waves"]["spk2"][0]
    clean = str(Path(tone_run["corpus"]) / f"audio_clean/{split}/spk2/{utt}.wav")
    noisy = wave + 0.02 * np.random.default_rng(5).standard_normal(len(wave))
    stored = tmp_path / "stored.wav"
    stored.write_bytes(wav_bytes(np.round(noisy * 32767).astype(np.int16), FS))
    norm = Normalizer(np.zeros(192, np.float32), np.ones(192, np.float32))
    renderer = Renderer(Storage(), fcfg, norm)

    def render(uri, recipe, stored_uri=""):
        (r,), _ = renderer.render_stream([StreamItem(0, utt, uri, fl, recipe, stored_uri)], 0, 3)
        return r.x

    got = render(clean, Recipe(0, stored=True), str(stored))
    np.testing.assert_array_equal(got, render(str(stored), Recipe(0)))
    assert not np.allclose(got, render(clean, Recipe(0)), atol=1e-2)
    assert render(clean, Recipe(0, speed=1.1, stored=True), str(stored)).shape[0] < got.shape[0]


def test_a_pass_reopened_mid_way_continues_exactly(tone_run):
    src, passes = _servers(tone_run, "train.minibatch_frames=64")
    p = max(passes[1:], key=src.num_batches)  # an offset > 0 pass
    full, _ = _drain(src, p)
    assert len(full) > 4 and p.offset > 0
    for start in (1, len(full) // 2):
        tail, _ = _drain(src, p, start=start)
        assert _same(tail, full[start:])


def test_an_unreadable_source_is_a_counted_reject_and_the_pass_goes_on(tone_run, tmp_path):
    src, passes = _servers(tone_run)
    p = passes[0]
    good, stream = _drain(src, p)
    examples = src.pass_metrics(p)["examples"]
    # the same sources, one of them now corrupt
    bad_src, _ = _servers(tone_run)
    victim = bad_src.utts[3]
    corrupt = tmp_path / "corrupt.wav"
    corrupt.write_bytes(b"RIFF\x00\x00not a wav at all")
    bad_src.utts[3] = victim._replace(uri=str(corrupt))
    bad, _ = _drain(bad_src, p)
    m = bad_src.pass_metrics(p)
    assert len(bad) == len(good)  # the agreed number of steps
    assert sum(m["stream_rejects"].values()) == 1 and m["examples"] == examples - 1
    assert sum(b[2] for b in bad) < sum(g[2] for g in good)


def test_the_stream_is_bounded_and_stops_with_the_trainer(tone_run):
    """A consumer that stops after one minibatch: the producer renders no more than a
    window ahead of the queue, and its thread ends."""
    src, passes = _servers(tone_run, "train.prefetch=1", "train.augment.window_streams=1",
                           "train.augment.stream_utts=1")
    p = passes[0]
    stream = src.open(p, 0, src.num_batches(p))
    it = iter(stream)
    next(it)
    import time

    time.sleep(1.0)
    rendered = src.pass_metrics(p)["examples"]
    assert stream._ahead._q.qsize() <= 1
    assert rendered <= 3 < len(src.utts)  # a window is one utterance: at most ~2 ahead
    it.close()
    assert stream._ahead._thread is None


def test_sortagrad_orders_the_pass_by_length():
    rng = np.random.default_rng(0)
    frames = rng.integers(20, 200, size=40)
    index = SplitIndex([f"p{i}" for i in range(4)], "labels", np.arange(40) % 4,
                       np.arange(40) // 4, frames, np.ones(40, bool), [str(i) for i in range(40)],
                       [""] * 40, 48, rows_in=40)
    spec = PassSpec(mode="full", minibatch_frames=400, shuffle_partitions=1, seed=3,
                    sortagrad=True)
    plan = plan_pass(index, spec)
    longest = [int(frames[bt[:, 0]].max()) for w in plan.windows for bt in w.batches]
    for w in plan.windows:
        lw = [int(frames[bt[:, 0]].max()) for bt in w.batches]
        assert lw == sorted(lw)
    means = [np.mean([frames[bt[:, 0]].mean() for bt in w.batches]) for w in plan.windows]
    assert means == sorted(means)
    # the same minibatches as without SortaGrad, in another order
    plain = plan_pass(index, PassSpec(mode="full", minibatch_frames=400, shuffle_partitions=1,
                                      seed=3))
    key = [tuple(sorted(bt[:, 0])) for w in plain.windows for bt in w.batches]
    assert sorted(key) == sorted(tuple(sorted(bt[:, 0])) for w in plan.windows for bt in w.batches)
    assert [int(frames[bt[:, 0]].max()) for w in plain.windows for bt in w.batches] != longest


def test_vtlp_warps_the_mel_filters():
    """A 1 kHz tone lands in a higher mel bin with warp 1.1 and a lower one with 0.9;
    warp 1 is the features step's filterbank, and the Nyquist frequency stays put."""
    from tasks.fbank import FbankComputer, vtlp_warp

    f = np.linspace(0, 8000, 81)
    assert np.array_equal(vtlp_warp(f, 1.0, FS), f)
    for a in (0.9, 1.1):
        w = vtlp_warp(f, a, FS)
        assert np.all(np.diff(w) > 0) and w[-1] == pytest.approx(8000.0)
    fcfg = load_config(ROOT / "configs" / "local.yaml").features
    tone = (0.1 * np.sin(2 * np.pi * 1000.0 * np.arange(8000) / FS)).astype(np.float32)
    peak = {a: int(np.median(FbankComputer(fcfg, warp=a).compute([tone])[0].argmax(1)))
            for a in (0.9, 1.0, 1.1)}
    assert peak[0.9] < peak[1.0] < peak[1.1]
    same = FbankComputer(fcfg, warp=1.0).compute([tone])[0]
    assert np.array_equal(same, FbankComputer(fcfg).compute([tone])[0])


def test_augment_config_errors_name_the_key():
    from core.config import ConfigError

    for bad, key in (("train.augment.room_prob=1.5", "train.augment.room_prob"),
                     ("train.augment.conditions=DP7", "train.augment.conditions"),
                     ("train.augment.speeds=3", "train.augment.speeds")):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            load_config(ROOT / "configs" / "local.yaml", [bad])
    with pytest.raises(ConfigError, match=r"train\.augment\.enabled"):
        load_config(ROOT / "configs" / "local.yaml",
                    ["train.augment.enabled=true", "train.regime=ssl"])
    cfg = load_config(ROOT / "configs" / "local.yaml", ["train.augment.speeds=0.9,1.0,1.1"])
    assert cfg.train.augment.speeds == [0.9, 1.0, 1.1] and not cfg.train.augment.enabled


def _weights(uri: str) -> dict:
    return load_model(Storage(), uri)[0].state_dict()


def test_augmented_teacher_trains_resumes_bitwise_and_reports_the_pool(tone_run):
    """`amflow train` with the example servers: learns, logs per-pass pool metrics, and a
    run killed mid-pass resumes to the same weights."""
    def train(*extra, expect=None):
        ctx = StepContext(_cfg(tone_run, *AUG, "train.sortagrad=true", "train.epochs=4",
                               "train.minibatch_frames=128", *extra), "r", "train")
        if expect is None:
            return train_step.run(ctx, None)
        with pytest.raises(expect):
            train_step.run(ctx, None)

    ref = train("train.tag=aug")
    m = ref["metrics"]
    assert m["dev_frame_acc"] > 0.6, m
    recs = [json.loads(line) for line in
            (Path(tone_run["run"]) / "train-aug" / "metrics.jsonl").read_text().splitlines()]
    inputs = [r for r in recs if r["kind"] == "input"]
    assert len(inputs) == len(ref["minibatches_per_pass"])
    for r in inputs:
        assert r["examples"] > 0 and r["examples_per_s"] > 0 and r["augment_cores"] > 0
        assert 0 <= r["input_wait_share"] <= 1
    wait, wall = (sum(r[k] for r in inputs) for k in ("input_wait_s", "step_wall_s"))
    assert m["input_wait_share"] == pytest.approx(wait / wall)
    assert m["input_wait_share_max_pass"] == max(r["input_wait_share"] for r in inputs)
    examples = sum(r["examples"] for r in inputs)
    assert m["augment_examples_per_core_s"] == pytest.approx(
        examples / sum(r["augment_cpu_s"] for r in inputs))
    assert m["trainer_examples_per_s"] == pytest.approx(examples / wall)
    assert m["augment_cores_needed"] == pytest.approx(
        m["trainer_examples_per_s"] / m["augment_examples_per_core_s"])
    assert m["augment_examples_per_s"] > 0 and m["augment_rejects"] == 0
    fail = 7
    train("train.tag=aug-resumed", f"train.fail_after={fail}", expect=InjectedFailure)
    latest = json.loads((Path(tone_run["run"]) / "train-aug-resumed" / "checkpoints" /
                         "latest.json").read_text())
    resumed = train("train.tag=aug-resumed", f"train.fail_after={fail}")
    assert resumed["resumed_from_step"] == latest["step"] == 5
    a, b = _weights(m["model_uri"]), _weights(resumed["metrics"]["model_uri"])
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.integration
def test_the_ray_pool_serves_the_same_batches(tone_run, ray_local):
    """Two ExampleServer actors render exactly what the in-process renderer does, also
    for a pass whose first window was submitted while the previous pass ran."""
    local, passes = _servers(tone_run)
    pooled, _ = _servers(tone_run, "train.augment.servers=2", "train.augment.cpus_per_server=0.5")
    pooled.passes = local.passes = passes
    try:
        for p in passes[1:]:
            assert _same(_drain(local, p)[0], _drain(pooled, p)[0])
            assert pooled.pass_metrics(p)["augment_cpu_s"] > 0
            if p.index == 1:  # pass 2's first window went in while pass 1 was served
                assert {k[0] for k in pooled._ahead} == {2}
        assert len(passes) == 3 and not pooled._ahead  # pass 3's warm start was used
    finally:
        pooled.close()
