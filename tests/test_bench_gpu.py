"""bench/gpu.py: the GPU bench's own logic, checked on the CPU (a GPU box runs it for real)."""
import json

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
    assert set(stored["section_s"]) == {"scorer", "train", "gtc", "serve"}
    assert r["gtc"] == {"skipped": "no GPU"}
    assert r["scorer"][0]["frames_per_s"] > 0 and r["train"][0]["frames_per_s"] > 0
    assert [row["batch"] for row in r["serve"]] == [1, 8, 32]
