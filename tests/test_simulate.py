"""`amflow simulate`: the cost models and the step's outputs."""
from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from core.runs import StepContext, StepError
from amflow.steps import simulate as simulate_step
from training import simulate as sim


def cluster(**kw):
    args = dict(gpus_per_host=8, intra_gbps=300.0, inter_gbps=25.0, latency_us=0.0,
                hbm_gbps=900.0)
    args.update(kw)
    return sim.Cluster(args["gpus_per_host"], args["intra_gbps"], args["inter_gbps"],
                       args["latency_us"], args["hbm_gbps"])


def test_paper_compute_time_from_epoch_time():
    # 2000 h at 33.3 frames/s in 290 min -> ~13.8 k frames/s -> ~0.1485 s per 2048 frames
    assert sim.paper_compute_s(2048, 24_000_000) == pytest.approx(0.1485, abs=5e-4)
    assert sim.paper_compute_s(4096, 48_000_000) == pytest.approx(4 * 0.1485, abs=2e-3)


def test_ring_cost_models():
    c = cluster()
    s = 96e6
    # inside one host: 300 Gb/s; across hosts the 25 Gb/s NIC bounds the ring
    assert c.allreduce(8, s) == pytest.approx(2 * 7 / 8 * s / (300e9 / 8))
    assert c.allreduce(16, s) == pytest.approx(2 * 15 / 16 * s / (25e9 / 8))
    assert c.allgather(16, 1000.0) == pytest.approx(15 * 1008 / (25e9 / 8))
    assert c.allreduce(1, s) == 0.0 and c.allgather(1, 5.0) == 0.0
    # HTM's upper tier has one rank per host: even 2 ranks cross hosts
    assert c.allreduce(2, s, spread=True) == pytest.approx(s / (25e9 / 8))
    lat = cluster(latency_us=10.0)
    assert lat.allreduce(4, 0.0) == pytest.approx(2 * 3 * 10e-6)
    assert lat.broadcast(8, 0.0) == pytest.approx(3 * 10e-6)


def _params(**kw):
    p = {"t_c": 0.1485, "params": 24_000_000, "minibatch_frames": 2048, "cv": 0.0,
         "gtc_s": 0.003, "gtc_pad": 1.1, "htm_s": 0.01, "htm_pad": 1.1, "block": 50,
         "group": 8, "ma_period": 196}
    p.update(kw)
    return p


def test_projection_shapes_and_limits():
    c = cluster(latency_us=25.0)
    t = sim.project(_params(), c, [1, 16, 128])
    for algo in sim.ALGORITHMS:
        assert t[algo][1]["speedup"] == pytest.approx(1.0)
        for n in (16, 128):
            assert 0 < t[algo][n]["speedup"] <= n
    # the communication-avoiding ones scale, GTC's all-gather grows with N
    assert t["bmuf"][128]["speedup"] > t["htm"][128]["speedup"] > t["gtc"][128]["speedup"]
    assert t["gtc"][128]["comm_s"] > 4 * t["gtc"][16]["comm_s"]


def test_htm_limits_match_bmuf_and_gtc():
    c = cluster(latency_us=25.0)
    p = _params(htm_s=0.003, htm_pad=1.1)
    one = sim.step_time("htm", 64, dict(p, group=1), c)
    bmuf = sim.step_time("bmuf", 64, p, c)
    # group size 1: the upper tier is BMUF over all (spread) workers
    assert sum(one.values()) == pytest.approx(sum(bmuf.values()), rel=0.02)
    whole = sim.step_time("htm", 8, dict(p, group=8), c)
    gtc = sim.step_time("gtc", 8, p, c)
    assert sum(whole.values()) == pytest.approx(sum(gtc.values()))  # one group: GTC


def test_jitter_term():
    assert sim.jitter(0.0, 1.0, 128, 1) == 0.0
    assert sim.jitter(0.1, 1.0, 128, 4) == pytest.approx(0.1 * 2 * math.sqrt(2 * math.log(128)))


def test_implied_fraction_inverts_the_model():
    c = cluster(latency_us=25.0)
    p = _params()
    f = sim.implied_gtc_fraction(10.9, 128, p, c)
    t = sim.project(dict(p, gtc_s=f), c, [128], ("gtc",))
    assert t["gtc"][128]["speedup"] == pytest.approx(10.9, rel=1e-3)


def test_step_writes_tables(local_cfg, tmp_path):
    cfg = local_cfg()
    ctx = StepContext(cfg, "sim1", "simulate")
    measured = {"measured": {"params_measured": 300_000, "minibatch_frames": 512,
                             "algorithms": {
                                 "gtc": {"sent_fraction": 0.004, "bytes_per_step": 5200,
                                         "payload_bytes_per_step": 4808, "workers": 8},
                                 "htm": {"sent_fraction": 0.006, "workers": 8},
                                 "sgd": {"bytes_per_step": 1_200_004}}}}
    path = tmp_path / "m.json"
    path.write_text(json.dumps(measured))
    out = simulate_step.run(ctx, SimpleNamespace(measured=str(path)))
    assert out["metrics"]["ordering_bmuf_htm_gtc"] is True
    table = json.loads((tmp_path / "store" / "runs" / "sim1" / "simulate" / "table.json")
                       .read_text())
    assert set(table["table"]) == set(sim.ALGORITHMS)
    assert table["notes"]["measured_bytes_over_model"]["sgd"] == pytest.approx(1.0)
    assert table["paper_htm_table1"]["bmuf"]["128"][0] == 101.5
    md = (tmp_path / "store" / "runs" / "sim1" / "simulate" / "table.md").read_text()
    assert "| BMUF | 128 |" in md and "101.5" in md
    assert "put Table 1 within 25 % at all" in md
    assert out["metrics"]["unreachable_within_25pct"] == ["gtc 64-128"]
    assert len(table["feasibility_within_25pct"]) == 9
    assert (tmp_path / "store" / "runs" / "sim1" / "simulate" / "_SUCCESS.json").exists()


def test_missing_measurement_is_a_clear_error(local_cfg):
    ctx = StepContext(local_cfg(), "sim2", "simulate")
    with pytest.raises(StepError, match="bench trainers"):
        simulate_step.run(ctx, SimpleNamespace(measured=None))
    # ... unless the sparsity is configured
    cfg = local_cfg("simulate.gtc_sent_fraction=0.003", "simulate.htm_sent_fraction=0.01")
    out = simulate_step.run(StepContext(cfg, "sim3", "simulate"), SimpleNamespace(measured=None))
    assert out["metrics"]["gtc_sent_fraction"] == 0.003


def test_codec_rate_what_if():
    c = cluster(latency_us=25.0)
    p = _params()
    k = p["gtc_s"] * p["params"]
    hbm = sim.step_time("gtc", 16, p, c)["codec"]
    assert hbm == pytest.approx(5 * 96e6 / 900e9 + 15 * k * 32 / 900e9)
    slow = sim.step_time("gtc", 16, dict(p, codec_gbps=2.0), c)["codec"]
    assert slow == pytest.approx(96e6 / 2e9 + 14 * k * 32 / 900e9)
    htm = sim.step_time("htm", 64, dict(p, codec_gbps=2.0), c)["codec"]
    k_htm = p["htm_s"] * p["params"]
    assert htm == pytest.approx(96e6 / 2e9 + 6 * k_htm * 32 / 900e9 + 4 * 96e6 / 900e9 / 50)
    # a slower codec costs every GTC-based method the same per minibatch, not BMUF
    assert sim.step_time("bmuf", 64, dict(p, codec_gbps=2.0), c) == \
        sim.step_time("bmuf", 64, p, c)


def test_overhead_window_holds_whatever_the_compute_time():
    lo, hi = sim.overhead_window(64, 21.7, 0.25)
    for t_c in (0.01, 0.1485, 3.0):
        for o in (lo, hi):  # the window's edges land exactly on the 25 % bounds
            speedup = 64 * t_c / (t_c * (1 + o))
            assert 0.75 * 21.7 - 1e-9 <= speedup <= 1.25 * 21.7 + 1e-9
    assert sim.overhead_window(16, 16.0, 0.25)[0] == 0.0  # linear scaling: no overhead needed


def test_table1_gtc_needs_superlinear_growth_from_64_to_128():
    lo, hi = sim.growth_needed(64, 21.7, 128, 10.9, 0.25)
    assert lo == pytest.approx(2.863, abs=1e-3) and hi == pytest.approx(10.78, abs=1e-2)


def test_model_growth_is_at_most_linear_in_hops():
    c = cluster(latency_us=25.0)
    here, lo, hi = sim.model_growth("gtc", 64, 128, _params(), c)
    assert 1.0 <= lo <= here <= hi <= 127 / 63 + 1e-9
    # bandwidth alone: the ring all-gather's (N - 1) hops over the same NIC
    pure = sim.model_growth("gtc", 64, 128, _params(gtc_s=1.0, gtc_pad=1.0),
                            cluster(latency_us=0.0, hbm_gbps=1e9))[0]
    assert pure == pytest.approx(127 / 63, rel=1e-3)


def test_feasibility_accepts_what_the_model_produces_and_flags_superlinear_rows():
    c = cluster(latency_us=25.0)
    p = _params(gtc_s=0.05)
    made = sim.project(p, c, [16, 32, 64, 128], ("gtc", "bmuf", "htm"))
    own = {a: {n: (made[a][n]["speedup"],) for n in made[a]} for a in made}
    assert all(r["reachable"] for r in sim.feasibility(own, p, c))
    # an overhead that quadruples per doubling of N (Table 1's GTC: x5.4 past 32 GPUs)
    t = p["t_c"]
    quad = {"gtc": {n: (n * t / (t + 0.5 * t * (n / 16) ** 2),) for n in (16, 32, 64, 128)}}
    rows = sim.feasibility(quad, p, c)
    assert [r["reachable"] for r in rows] == [True, False, False]
    paper = sim.feasibility(sim.HTM_TABLE1, p, c)
    assert [(r["algorithm"], r["workers"]) for r in paper if not r["reachable"]] == \
        [("gtc", [64, 128])]


def test_unreachable_rows_say_which_way_they_miss():
    fast = {"algorithm": "gtc", "workers": [64, 128], "needed_growth": [2.86, 10.8],
            "model_growth_range": [1.0, 2.02]}
    slow = dict(fast, needed_growth=[0.1, 0.5])
    assert "needs >= x2.86, the model grows at most x2.02" in sim._why_unreachable(fast)
    assert "needs <= x0.50, the model grows at least x1.00" in sim._why_unreachable(slow)
