"""Acoustic models: shapes, look-ahead causality, paper sizes, checkpoint round trip."""
import pytest
import torch

from core.config import ModelConfig, StudentConfig, TeacherConfig
from core.storage import Storage
from training.checkpoint import MODEL_FORMAT, load_model, save_model
from training.models import (StudentLSTM, TeacherBLSTM, build_model, lstm_parameter_count,
                             model_from_spec, model_spec, num_parameters, resolve_num_classes)

torch.set_num_threads(1)


def test_shapes_and_padding():
    torch.manual_seed(0)
    for m in (StudentLSTM(12, 8, 2, 5, lookahead=3), TeacherBLSTM(12, 8, 2, 5)):
        x = torch.randn(3, 20, 12)
        assert m(x).shape == (3, 20, 5)
        # a padded batch gives the same outputs on the real frames as each sequence alone
        lens = torch.tensor([20, 11, 4])
        xp = x.clone()
        for i, n in enumerate(lens):
            xp[i, n:] = 0
        y = m(xp, lens)
        for i, n in enumerate(lens):
            alone = m(xp[i:i + 1, :n])
            assert torch.allclose(y[i, :n], alone[0], atol=1e-5)


def test_teacher_padded_batch_matches_packed_sequences_with_gradients():
    # The teacher's padded path (no packing) must equal PyTorch's packed BLSTM exactly,
    # in outputs and in gradients, including the between-layer dropout's absence in eval.
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
    torch.manual_seed(0)
    m = TeacherBLSTM(10, 16, 3, 7)
    lens = torch.tensor([17, 3, 9, 1, 12])
    x = torch.randn(5, 17, 10)
    mask = torch.arange(17)[None] < lens[:, None]
    x[~mask] = 0
    y = m(x, lens)
    packed = pack_padded_sequence(x, lens, batch_first=True, enforce_sorted=False)
    ref = m.output(pad_packed_sequence(m.lstm(packed)[0], batch_first=True, total_length=17)[0])
    assert torch.allclose(y[mask], ref[mask], atol=1e-6)
    # the GPU's path (cuDNN on packed sequences) is that same reference
    assert torch.equal(m.output(m._run_packed(x, lens))[mask], ref[mask])
    grads = torch.autograd.grad(y[mask].square().sum(), list(m.parameters()))
    ref_grads = torch.autograd.grad(ref[mask].square().sum(), list(m.parameters()))
    for g, r in zip(grads, ref_grads):
        assert torch.allclose(g, r, atol=1e-5)


def test_the_padded_path_draws_nothing_from_the_global_rng():
    """Dropout draws from the global RNG: the teacher's padded path must not, even the
    first time a layer shape is seen in a process (its weightless LSTM shells are built
    then), or a training's dropout would depend on what its process ran before."""
    from training.models import lstm_layer_template
    m = TeacherBLSTM(10, 16, 2, 7).eval()
    x, lens = torch.randn(3, 9, 10), torch.tensor([9, 4, 6])
    lstm_layer_template.cache_clear()
    torch.manual_seed(5)
    before = torch.get_rng_state()
    m(x, lens)
    assert torch.equal(torch.get_rng_state(), before)


def test_student_lookahead_is_exactly_three_frames():
    torch.manual_seed(0)
    m = StudentLSTM(6, 8, 2, 4, lookahead=3).eval()
    x = torch.randn(1, 30, 6)
    y = m(x)
    x2 = x.clone()
    x2[0, 20:] += 5.0  # change the future from frame 20 on
    y2 = m(x2)
    assert torch.equal(y[0, :17], y2[0, :17])  # outputs up to t=16 see frames <= 19
    assert not torch.allclose(y[0, 17], y2[0, 17])  # t=17 sees frame 20
    # the teacher is bidirectional: early outputs change too
    t = TeacherBLSTM(6, 8, 1, 4).eval()
    assert not torch.allclose(t(x)[0, 0], t(x2)[0, 0])


def test_paper_sizes():
    # student 5 x 768 LSTM, 192-d input, 3183 senones: "about 24 M parameters"
    n_student = lstm_parameter_count(192, 768, 5, 3183)
    assert 23e6 < n_student < 25e6
    cfg = ModelConfig(student=StudentConfig(5, 768, 3), teacher=TeacherConfig(5, 768),
                      num_classes=3183)
    m = build_model("student", 192, 3183, cfg)
    assert num_parameters(m) == n_student and m.lookahead == 3
    # teacher 5 x 768 per direction BLSTM is ~3x the student
    n_teacher = lstm_parameter_count(192, 768, 5, 3183, bidirectional=True)
    assert 2.5 < n_teacher / n_student < 3.0
    assert num_parameters(TeacherBLSTM(12, 16, 2, 7)) == lstm_parameter_count(12, 16, 2, 7, True)


def test_num_classes_from_config_or_inventory():
    assert resolve_num_classes(ModelConfig(num_classes=0), ["a", "b", "c"]) == 3
    assert resolve_num_classes(ModelConfig(num_classes=3183), ["a", "b"]) == 3183
    # a network tree's leaves are the classes: a set count must be theirs (a tiny corpus's
    # tree under configs/aws.yaml's 3,183 once trained outputs no phone stood for)
    assert resolve_num_classes(ModelConfig(num_classes=3), ["a", "b", "c"], tree_leaves=True) == 3
    assert resolve_num_classes(ModelConfig(num_classes=0), ["a", "b", "c"], tree_leaves=True) == 3
    with pytest.raises(ValueError, match=r"model.num_classes=3183.*3 leaves.*set model.num_classes to 0"):
        resolve_num_classes(ModelConfig(num_classes=3183), ["a", "b", "c"], tree_leaves=True)
    with pytest.raises(ValueError):
        resolve_num_classes(ModelConfig(num_classes=2), ["a", "b", "c"])
    with pytest.raises(ValueError):
        resolve_num_classes(ModelConfig(num_classes=0), [])


def test_spec_and_model_file_round_trip(tmp_path):
    torch.manual_seed(1)
    st = Storage()
    for m in (StudentLSTM(6, 5, 2, 4, lookahead=2), TeacherBLSTM(6, 5, 1, 4)):
        spec = model_spec(m)
        assert model_from_spec(spec).kind == m.kind
        uri = str(tmp_path / f"{m.kind}.pt")
        cmvn = {"count": 10, "sum": [0.0] * 6, "sumsq": [10.0] * 6}
        save_model(st, uri, m, cmvn=cmvn, phones=list("abcd"), features={"stack": 3},
                   info={"run_id": "r"})
        raw = torch.load(uri, weights_only=True)  # plain types only
        assert raw["format"] == MODEL_FORMAT and raw["spec"] == spec
        loaded, meta = load_model(st, uri)
        assert meta["cmvn"] == cmvn and meta["phones"] == list("abcd")
        assert meta["features"]["stack"] == 3 and not loaded.training
        x = torch.randn(2, 9, 6)
        assert torch.equal(loaded(x), m.eval()(x))
