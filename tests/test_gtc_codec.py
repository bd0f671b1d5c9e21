"""The GTC codec without a process group: packing, encoding, the residual invariant."""
from __future__ import annotations

import pytest
import torch

from training.algorithms.gtc import (MAX_INDEX, Thresholds, decode_add_, encode_,
                                     mask_indices, pack, padded_bool, unpack)


def test_pack_round_trip_edges_and_random():
    edges = torch.tensor([0, 1, 2, 7, 8, 255, 256, 65535, 65536, 2**24, 2**30, 2**31 - 2,
                          MAX_INDEX], dtype=torch.int64)
    rnd = torch.randint(0, MAX_INDEX + 1, (100_000,), dtype=torch.int64,
                        generator=torch.Generator().manual_seed(0))
    idx = torch.cat([edges, rnd])
    for neg in (torch.zeros_like(idx, dtype=torch.bool), torch.ones_like(idx, dtype=torch.bool),
                torch.rand(idx.shape, generator=torch.Generator().manual_seed(1)) < 0.5):
        codes = pack(idx, neg)
        assert codes.dtype == torch.int32
        back, bneg = unpack(codes)
        assert torch.equal(back, idx) and torch.equal(bneg, neg)


def test_pack_round_trip_every_bit_alone_and_cleared():
    """pack/unpack are bitwise (an in-range cast, OR, AND, a sign test): each output bit
    follows one input bit. Every index bit set alone, cleared alone, and every low run of
    ones, with both signs, covers each bit's behaviour; the full sweep below proves it over
    all 2^32 inputs (minutes: `make test-exhaustive`)."""
    bits = torch.arange(31, dtype=torch.int64)
    alone = torch.ones(31, dtype=torch.int64) << bits
    idx = torch.cat([alone, MAX_INDEX ^ alone, alone - 1, torch.tensor([MAX_INDEX])])
    for sign in (False, True):
        neg = torch.full(idx.shape, sign, dtype=torch.bool)
        codes = pack(idx, neg)
        assert codes.dtype == torch.int32
        assert torch.equal(codes.to(torch.int64) & MAX_INDEX, idx)
        back, bneg = unpack(codes)
        assert torch.equal(back, idx) and bool(bneg.all()) == sign and bool(bneg.any()) == sign


@pytest.mark.exhaustive
def test_pack_round_trip_every_index():
    """Every index 0 .. 2^31 - 1, both signs, in chunks."""
    chunk = 1 << 25
    for start in range(0, MAX_INDEX + 1, chunk):
        idx = torch.arange(start, start + chunk, dtype=torch.int64)
        for sign in (False, True):
            neg = torch.full(idx.shape, sign, dtype=torch.bool)
            back, bneg = unpack(pack(idx, neg))
            assert torch.equal(back, idx), start
            assert bool(bneg.all()) == sign and bool(bneg.any()) == sign


def test_pack_layout_is_sign_bit_plus_index():
    codes = pack(torch.tensor([5, 5]), torch.tensor([False, True]))
    assert codes.tolist() == [5, 5 - 2**31]


def test_mask_indices_matches_nonzero():
    g = torch.Generator().manual_seed(0)
    for n in (8, 64, 1000, 4096 + 3):
        for p in (0.0, 0.001, 0.05, 0.5, 1.0):
            m = padded_bool(n, torch.device("cpu"))
            m[:n] = torch.rand(n, generator=g) < p
            assert torch.equal(mask_indices(m), m.nonzero().view(-1))


def test_sent_plus_residual_is_exactly_the_sum_of_gradients():
    """Dyadic gradients keep every float operation exact, so the identity is bit-exact."""
    g = torch.Generator().manual_seed(0)
    n, tau = 10_003, 0.25
    residual = torch.zeros(n)
    sent_total = torch.zeros(n)
    grad_total = torch.zeros(n)
    sent_count = 0
    for _ in range(40):
        grad = torch.randint(-64, 65, (n,), generator=g).float() / 512  # |g| <= 1/8
        grad_total += grad
        codes = encode_(residual, grad, tau)
        sent_count += codes.numel()
        decode_add_(sent_total, codes, tau)
        assert torch.equal(sent_total + residual, grad_total)
        assert bool((residual.abs() < tau + 0.125).all())
    assert sent_count > 0


def test_encode_sends_exactly_the_elements_over_threshold():
    residual = torch.tensor([0.0, 0.5, -0.5, 0.99, -1.0, 1.0, 3.0, -2.5, 0.0])
    grad = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.5])
    codes = encode_(residual, grad, 1.0)
    idx, neg = unpack(codes)
    assert idx.tolist() == [4, 5, 6, 7, 8]
    assert neg.tolist() == [True, False, False, True, False]
    torch.testing.assert_close(residual, torch.tensor([0.0, 0.5, -0.5, 0.99, 0.0, 0.0, 2.0,
                                                       -1.5, 0.5]))


def test_decode_accumulates_duplicates_from_many_workers():
    out = torch.zeros(5)
    a = pack(torch.tensor([1, 3]), torch.tensor([False, True]))
    b = pack(torch.tensor([1, 4]), torch.tensor([False, False]))
    for codes in (a, b):
        decode_add_(out, codes, 0.5)
    assert out.tolist() == [0.0, 1.0, 0.0, -0.5, 0.5]


def test_too_many_elements_is_refused():
    class Big:
        def numel(self):
            return MAX_INDEX + 2

    with pytest.raises(ValueError):
        encode_(Big(), None, 1.0)  # type: ignore[arg-type]


def test_per_segment_thresholds():
    """One tau per tensor: identity still exact, quanta follow the segment's tau."""
    g = torch.Generator().manual_seed(3)
    sizes = [5, 1000, 37, 2048]
    th = Thresholds(sizes, [0.5, 0.125, 2.0, 0.25])
    n = sum(sizes)
    residual, sent_total, grad_total = torch.zeros(n), torch.zeros(n), torch.zeros(n)
    for _ in range(30):
        grad = torch.randint(-64, 65, (n,), generator=g).float() / 256
        grad_total += grad
        codes = encode_(residual, grad, th)
        decode_add_(sent_total, codes, th)
        assert torch.equal(sent_total + residual, grad_total)
    idx, _ = unpack(codes)
    assert torch.equal(th.of(torch.tensor([0, 4, 5, 1004, 1005, 1041, 1042, n - 1])),
                       torch.tensor([0.5, 0.5, 0.125, 0.125, 2.0, 2.0, 0.25, 0.25]))
    # decode with a scale: the average over workers
    out = torch.zeros(n)
    decode_add_(out, pack(torch.tensor([0, 6]), torch.tensor([True, False])), th, 0.5)
    assert out[0] == -0.25 and out[6] == 0.0625
