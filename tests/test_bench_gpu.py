"""bench/gpu.py: the GPU bench's own logic, checked on the CPU (a GPU box runs it for real)."""
import json

import numpy as np
import torch

from bench import gpu
from training.algorithms.gtc import Thresholds


def test_agreement_counts_what_fp16_changes():
    torch.manual_seed(0)
    ref = torch.randn(200, 68)
    same = gpu._agreement(ref, ref.clone())
    assert same["argmax_agreement"] == 1.0 and same["top20_overlap"] == 1.0
    assert same["max_abs_logit_diff"] == 0.0
    half = gpu._agreement(ref, ref.half())
    assert 0 < half["max_abs_logit_diff"] < 0.01
    swapped = ref.clone()
    swapped[:, 0] = ref.max(1).values + 1  # every argmax moves to class 0
    moved = gpu._agreement(ref, swapped)
    assert moved["argmax_agreement"] < 0.1 and moved["top20_overlap"] >= 19 / 20 - 1e-6


def test_codec_lockstep_is_bitwise_equal_against_itself():
    torch.manual_seed(0)
    sizes = [1000, 24, 3000]
    grads = [torch.randn(sum(sizes)) for _ in range(2)]
    tau = Thresholds(sizes, [3.0 * float(g.abs().mean()) for g in grads[0].split(sizes)])
    r = gpu.codec_lockstep(grads, tau, "cpu", steps=6)
    assert r["codes_and_residual_bitwise_equal"] is True
    assert 0 < r["sent_fraction"] < 1 and r["device_gb_per_s"] > 0


def test_quick_run_writes_every_section(tmp_path):
    out = tmp_path / "gpu.json"
    r = gpu.main(["--quick", "--devices", "cpu", "--out", str(out)])
    stored = json.loads(out.read_text())
    assert set(stored["section_s"]) == {"scorer", "stored", "train", "gtc", "serve"}
    assert r["gtc"] == {"skipped": "no GPU"}
    assert r["scorer"][0]["frames_per_s"] > 0 and r["train"][0]["frames_per_s"] > 0
    assert [row["batch"] for row in r["serve"]] == [1, 8, 32]


def test_stored_section_counts_bytes_entries_and_identical_frames():
    rows = {(r["codec"]): r for r in gpu.stored_section(["cpu", "cpu"], quick=True)
            if r.get("frames_stored_identical") is not None}
    # the same device twice stores the same bytes, and the student rebuilds the same targets
    for r in rows.values():
        assert r["frames_stored_identical"] == 1.0 and r["target_tv_max"] == 0.0
    assert rows["fp16"]["bytes_per_frame"] == 80.0 and rows["fp16"]["entries_per_frame"] == 20
    # mass 0.99 keeps fewer entries, two bytes each, plus the count byte
    sq = rows["sqrt31"]
    assert 3 < sq["entries_per_frame"] < 20
    assert abs(sq["bytes_per_frame"] - (2 * sq["entries_per_frame"] + 1)) < 0.01


def test_frames_alike_sees_a_changed_level_count_or_class():
    from core.records import PAD_LOGIT, dequantize_sqrt
    idx = np.array([[4, 7, 0], [1, 2, 3], [9, 0, 1]])
    val = dequantize_sqrt(np.array([[30, 3, 1], [20, 9, 2], [31, 1, 1]]), 31)
    val[0, 2] = val[2, 1:] = PAD_LOGIT  # frames keep 2, 3 and 1 entries
    ref = (idx, val)
    assert gpu._frames_alike(ref, (idx, val)) == 3
    level, count, cls = val.copy(), val.copy(), idx.copy()
    level[1, 2] = dequantize_sqrt(np.array([3]), 31)[0]
    count[0, 2] = dequantize_sqrt(np.array([1]), 31)[0]  # a third entry kept
    cls[2, 0] = 8
    for changed in ((idx, level), (idx, count), (cls, val)):
        assert gpu._frames_alike(ref, changed) == 2
