"""Pass plans (labeled, scheduled learning) and learning-rate schedules."""
import pytest

from core.config import TrainConfig
from training.schedules import LRSchedule, plan_passes


def test_labeled_recipe_chunk_then_finetune_with_rotating_offsets():
    tc = TrainConfig.from_flat(recipe="labeled", epochs=5, finetune_epochs=2)
    passes = plan_passes(tc, stack=3)
    assert [p.mode for p in passes] == ["chunk"] * 3 + ["full"] * 2
    assert [p.offset for p in passes] == [0, 1, 2, 0, 1]
    assert all(p.kind == "labeled" and p.last_in_unit for p in passes)
    with pytest.raises(ValueError):
        plan_passes(TrainConfig.from_flat(epochs=2, finetune_epochs=3), stack=3)


def test_ssl_recipe_interleaves_subepochs_and_labeled_passes():
    tc = TrainConfig.from_flat(recipe="ssl", sub_epochs=4, finetune_epochs=1, labeled_lr_scale=1.5)
    passes = plan_passes(tc, stack=3)
    assert [(p.kind, p.sub_epoch if p.kind == "unlabeled" else None) for p in passes] == [
        ("unlabeled", 0), ("labeled", None), ("unlabeled", 1), ("labeled", None),
        ("unlabeled", 2), ("labeled", None), ("unlabeled", 3), ("labeled", None)]
    assert [p.mode for p in passes[-2:]] == ["full", "full"]
    assert [p.mode for p in passes[:-2]] == ["chunk"] * 6
    assert [p.offset for p in passes if p.kind == "labeled"] == [0, 1, 2, 0]
    assert all(p.offset == 0 for p in passes if p.kind == "unlabeled")
    # labeled passes run at a higher rate than the sub-epoch before them
    s = LRSchedule(tc, passes)
    end_of_sub = s.lr(passes[2], 99, 100)
    assert s.lr(passes[3], 0, 10) == pytest.approx(1.5 * s.exponential(2 / 4))
    assert s.lr(passes[3], 0, 10) > end_of_sub


def test_exponential_decay_end_points_and_monotone():
    tc = TrainConfig.from_flat(epochs=4, finetune_epochs=1, lr=1e-2, final_lr=1e-4)
    passes = plan_passes(tc, 3)
    s = LRSchedule(tc, passes)
    assert s.lr(passes[0], 0, 10) == pytest.approx(1e-2)
    assert s.exponential(1.0) == pytest.approx(1e-4)
    rates = [s.lr(p, b, 10) for p in passes for b in range(10)]
    assert all(a > b for a, b in zip(rates, rates[1:]))
    assert s.lr(passes[2], 0, 10) == pytest.approx(1e-2 * (1e-2) ** 0.5)


def test_newbob_halves_then_stops_and_jumps_to_finetuning():
    tc = TrainConfig.from_flat(schedule="newbob", epochs=8, finetune_epochs=2, lr=0.08, min_lr=0.02,
                     newbob_threshold=0.01)
    passes = plan_passes(tc, 3)
    s = LRSchedule(tc, passes)
    s.end_unit(0, 1.0)
    assert s.newbob_lr == 0.08 and s.next_pass(0) == 1
    s.end_unit(1, 0.8)  # 20 % better: keep
    assert s.newbob_lr == 0.08
    s.end_unit(2, 0.799)  # < 1 %: halve
    assert s.newbob_lr == 0.04 and s.halvings == 1
    assert s.lr(passes[3], 5, 10) == 0.04
    s.end_unit(3, 0.7985)  # halve again -> 0.02 (== min_lr, allowed)
    assert s.newbob_lr == 0.02
    s.end_unit(4, 0.7984)  # would go below min_lr: stop the chunked phase
    assert s.next_pass(4) == 6 and passes[6].mode == "full"
    s.end_unit(6, 0.7983)
    assert s.next_pass(6) is None
    # state round trip
    s2 = LRSchedule(tc, passes)
    s2.load_state_dict(s.state_dict())
    assert s2.state_dict() == s.state_dict()


def test_gradual_warmup_ramps_linearly_then_hands_over_to_the_schedule():
    tc = TrainConfig.from_flat(epochs=5, finetune_epochs=0, lr=1.0, final_lr=0.1, lr_warmup_units=2,
                     lr_warmup_start=0.25)
    passes = plan_passes(tc, 3)
    s = LRSchedule(tc, passes)
    plain = LRSchedule(TrainConfig.from_flat(epochs=5, finetune_epochs=0, lr=1.0, final_lr=0.1),
                       passes)
    assert s.lr(passes[0], 0, 10) == pytest.approx(0.25)
    # half way through the warm-up: half way from 0.25 to 1, times the decayed rate
    assert s.lr(passes[1], 0, 10) == pytest.approx(0.625 * plain.lr(passes[1], 0, 10))
    for p in passes[2:]:
        for b in (0, 5):
            assert s.lr(p, b, 10) == pytest.approx(plain.lr(p, b, 10))
    warm = [s.lr(p, b, 10) for p in passes[:2] for b in range(10)]
    assert all(w < plain.lr(p, b, 10) for w, (p, b) in
               zip(warm, [(p, b) for p in passes[:2] for b in range(10)]))
    assert all(a < b for a, b in zip(warm[:10], warm[1:10]))  # rising in the first pass


def test_warmup_settings_are_validated_by_key():
    from core.config import ConfigError, load_config
    with pytest.raises(ConfigError, match="train.lr_warmup_start"):
        load_config(None, ["train.lr_warmup_start=0"])
    with pytest.raises(ConfigError, match="train.lr_warmup_units"):
        load_config(None, ["train.lr_warmup_units=-1"])
