"""Stochastic rounding to fp16/bf16: unbiased over the whole range, two neighbours only, exact, seeded."""

from __future__ import annotations

import math

import pytest
import torch

import optim.stochastic_rounding as sr
from optim.stochastic_rounding import accumulate_small_updates, round_stochastic

FP16_TINY = 2.0**-24  # the smallest fp16 subnormal
FP16_MAX = 65504.0
BF16_MAX = float(torch.finfo(torch.bfloat16).max)
FP32_MAX = float(torch.finfo(torch.float32).max)
# The step after the largest finite value, which the dtype spells inf: the overflow policy rounds into it.
VIRTUAL_TOP = {torch.float16: 2.0**16, torch.bfloat16: 2.0**128}
DTYPES = [torch.float16, torch.bfloat16]
Z_LIMIT = 5.0  # |z| beyond 5 has probability 6e-7 for an unbiased rounding; the seeds are fixed anyway


def ulp16(v: float) -> float:
    return 2.0 ** (max(math.frexp(v)[1] - 1, -14) - 10)


def ulp_bf16(v: float) -> float:
    return 2.0 ** (max(math.frexp(v)[1] - 1, -126) - 7)


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def neighbours(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(toward zero, away from zero) neighbours of fp32 ``x`` in ``dtype``: equal where x is representable."""
    nearest = x.to(dtype)
    zero = torch.zeros_like(nearest)
    toward = torch.where(nearest.double().abs() > x.double().abs(), torch.nextafter(nearest, zero), nearest)
    outward = torch.copysign(torch.full_like(nearest, math.inf), x.to(dtype))
    away = torch.where(toward.double() == x.double(), toward, torch.nextafter(toward, outward))
    return toward, away


def probability_up(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Fractional position of |x| between its neighbours (float64), inf standing for the virtual top step."""
    lo, hi = (v.double().abs() for v in neighbours(x, dtype))
    hi = torch.where(torch.isinf(hi), VIRTUAL_TOP[dtype], hi)
    span = torch.where(hi > lo, hi - lo, 1.0)
    return (x.double().abs() - lo) / span


def z_score(ups: float, n: int, p: float) -> float:
    """Normal approximation to the binomial: (ups - n p) / sqrt(n p (1 - p))."""
    return (ups - n * p) / math.sqrt(n * p * (1 - p))


def all_values(dtype: torch.dtype) -> torch.Tensor:
    """Every non-NaN value of a 16-bit dtype (both zeros, subnormals, infinities), as fp32."""
    values = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
    return values[~torch.isnan(values)].float()


# (value, elements): each class of value, with the fractional position deliberately not a round number.
CASES = {
    torch.float16: [
        (1 + 0.3 * ulp16(1.0), 1 << 17),  # normal
        (1000 + 0.71 * ulp16(1000.0), 1 << 17),
        (2.0**-14 + 0.45 * FP16_TINY, 1 << 17),  # smallest binade of normals
        (FP16_TINY * (5 + 0.25), 1 << 17),  # subnormal: 23 fp32 bits below the grid here
        (FP16_TINY * (1000 + 0.9), 1 << 17),
        (0.37 * FP16_TINY, 1 << 17),  # below the smallest subnormal: 0 or 2**-24
        (0.003 * FP16_TINY, 1 << 18),
        (FP16_MAX - 0.25 * 32, 1 << 17),  # just below the largest finite
        (FP16_MAX + 0.25 * 32, 1 << 17),  # between 65504 and the virtual 65536: 65504 or inf
        (FP16_MAX + 0.9 * 32, 1 << 17),
        (-(1 + 0.3 * ulp16(1.0)), 1 << 17),  # negative values mirror the positive ones
        (-FP16_TINY * (5 + 0.25), 1 << 17),
        (-0.37 * FP16_TINY, 1 << 17),
        (-(FP16_MAX + 0.25 * 32), 1 << 17),
        # Fractions finer than 2**-13 of the grid step: a rounding that uses only 13 random bits (or scales by
        # 2**-112 first) never goes up here, since its threshold is 0; the expectation is about 64 and 90 ups.
        (FP16_TINY * (5 + 2.0**-15), 1 << 21),
        (1.4 * 2.0**-39, 1 << 21),
    ],
    torch.bfloat16: [
        (1 + 0.3 * ulp_bf16(1.0), 1 << 17),
        (-(1 + 0.3 * ulp_bf16(1.0)), 1 << 17),
        (3.0e-30, 1 << 17),
        (1.0e30, 1 << 17),
        (65504.0 + 8, 1 << 17),  # fp16's overflow threshold means nothing to bf16
        (2.0**-133 * 1.3, 1 << 17),  # bf16 subnormal (spacing 2**-133 = fp32 subnormal spacing * 2**16)
        (2.0**-149 * 3001, 1 << 17),  # below the smallest bf16 subnormal: an fp32 subnormal
        (-(2.0**-149) * 3001, 1 << 17),
        (BF16_MAX + 0.3 * ulp_bf16(BF16_MAX), 1 << 17),  # above the largest finite: bf16 max or inf
        (FP32_MAX, 1 << 17),  # inf with probability 1 - 2**-16: about 2 stay finite
        (-FP32_MAX, 1 << 17),
    ],
}


@pytest.mark.parametrize(
    ("dtype", "value", "n"),
    [(dtype, value, n) for dtype, cases in CASES.items() for value, n in cases],
    ids=[f"{str(dtype)[6:]}-{value:.6g}" for dtype, cases in CASES.items() for value, _ in cases],
)
def test_probability_of_rounding_up_is_the_fractional_position(dtype: torch.dtype, value: float, n: int) -> None:
    x = torch.full((n,), value)
    p = probability_up(x[:1], dtype).item()
    assert 0 < p < 1, "each case must lie strictly between two neighbours"
    lo, hi = neighbours(x[:1], dtype)
    out = round_stochastic(x, dtype, seeded(1))
    assert out.dtype == dtype
    is_lo, is_hi = out == lo, out == hi
    assert bool((is_lo | is_hi).all()), "every result is one of the two neighbours"
    ups = int(is_hi.sum())
    assert abs(z_score(ups, n, p)) < Z_LIMIT, f"P(up) = {ups / n:.6g}, expected {p:.6g}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_unbiased_at_random_points_of_the_whole_grid(dtype: torch.dtype) -> None:
    """Random grid steps (normals, subnormals, the step below the smallest subnormal, the top step into inf) at
    random fractional positions, 4000 roundings each: every P(up) matches."""
    g = seeded(2)
    finite = all_values(dtype)
    finite = finite[torch.isfinite(finite) & (finite >= 0)]
    top = finite.max()
    subnormal_end = 2.0**-14 if dtype == torch.float16 else 2.0**-126
    normals, subnormals = finite[finite >= subnormal_end], finite[(finite > 0) & (finite < subnormal_end)]
    picks = [pool[torch.randint(len(pool), (n,), generator=g)] for pool, n in ((normals, 300), (subnormals, 100))]
    lo = torch.cat([*picks, torch.zeros(40), top.expand(20)])
    hi = torch.nextafter(lo.to(dtype), torch.full_like(lo, math.inf, dtype=dtype)).float()
    hi = torch.where(torch.isinf(hi), VIRTUAL_TOP[dtype], hi.double())
    frac = torch.rand(len(lo), generator=g, dtype=torch.float64) * 0.9 + 0.05
    sign = torch.where(torch.rand(len(lo), generator=g) < 0.5, -1.0, 1.0).double()
    points = (sign * (lo.double() + frac * (hi - lo.double()))).float()
    p = probability_up(points, dtype)
    assert bool(((p > 0.04) & (p < 0.96)).all())
    reps = 4000
    out = round_stochastic(points.repeat(reps, 1), dtype, seeded(3))
    _, away = neighbours(points, dtype)
    ups = (out == away).sum(0).double()
    z = (ups - reps * p) / torch.sqrt(reps * p * (1 - p))
    assert float(z.abs().max()) < Z_LIMIT + 0.5  # 460 points: a little more room than for one


def int32_bits(bits: torch.Tensor) -> torch.Tensor:
    """int64 holding unsigned 32-bit patterns -> the int32 with those bits."""
    return torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32)


def random_floats(n: int, exponents: tuple[int, int], generator: torch.Generator) -> torch.Tensor:
    """fp32 values with random sign and mantissa, biased exponent uniform in [lo, hi] (0 gives subnormals)."""
    sign = torch.randint(0, 2, (n,), generator=generator, dtype=torch.int64) << 31
    exponent = torch.randint(exponents[0], exponents[1] + 1, (n,), generator=generator, dtype=torch.int64) << 23
    mantissa = torch.randint(0, 1 << 23, (n,), generator=generator, dtype=torch.int64)
    return int32_bits(sign | exponent | mantissa).view(torch.float32)


@pytest.mark.parametrize(
    ("dtype", "exponents"),
    [
        (torch.float16, (80, 145)),  # 2**-47 to 2**18: tiny, subnormal, normal and overflowing fp16
        (torch.float16, (0, 254)),  # every finite fp32
        (torch.bfloat16, (0, 254)),
    ],
)
def test_results_are_neighbours_with_the_sign_kept(dtype: torch.dtype, exponents: tuple[int, int]) -> None:
    x = random_floats(1 << 18, exponents, seeded(4))
    out = round_stochastic(x, dtype, seeded(5))
    lo, hi = neighbours(x, dtype)
    is_lo, is_hi = out == lo, out == hi
    assert bool((is_lo | is_hi).all())
    assert bool((torch.signbit(out) == torch.signbit(x)).all())
    strict = lo != hi
    assert float((is_hi & strict).sum()) > 0.2 * float(strict.sum())  # both neighbours occur
    assert float((is_lo & strict).sum()) > 0.2 * float(strict.sum())


@pytest.mark.parametrize("dtype", DTYPES)
def test_representable_values_come_back_unchanged(dtype: torch.dtype) -> None:
    x = all_values(dtype)  # includes +-0, subnormals, the largest finite and +-inf
    for seed in (6, 7):
        out = round_stochastic(x, dtype, seeded(seed))
        assert torch.equal(out.view(torch.int16), x.to(dtype).view(torch.int16))


@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_stays_nan_and_inf_stays_inf(dtype: torch.dtype) -> None:
    # Quiet and signalling NaNs, payloads in the low bits that a rounding could clear or carry out of.
    nans = [0x7FC00000, 0x7F800001, 0x7F801FFF, 0x7F80FFFF, 0x7FBFFFFF, 0x7FFFFFFF, 0xFFC00000, 0xFF800001, 0xFFFFFFFF]
    bits = int32_bits(torch.tensor(nans, dtype=torch.int64))
    out = round_stochastic(bits.view(torch.float32).repeat(1000), dtype, seeded(8))
    assert bool(torch.isnan(out).all())
    infs = round_stochastic(torch.tensor([math.inf, -math.inf]).repeat(1000), dtype, seeded(9))
    assert torch.equal(infs.float(), torch.tensor([math.inf, -math.inf]).repeat(1000))


@pytest.mark.parametrize("dtype", DTYPES)
def test_negative_values_mirror_positive_ones(dtype: torch.dtype) -> None:
    x = random_floats(1 << 18, (0, 254), seeded(10)).abs()
    x[:1000] = 0.0
    pos = round_stochastic(x, dtype, seeded(11))
    neg = round_stochastic(-x, dtype, seeded(11))
    assert torch.equal(neg.view(torch.int16), pos.view(torch.int16) ^ -0x8000)  # same bits, sign flipped


def test_fp16_overflow_policy() -> None:
    big = torch.tensor([65536.0, 65537.0, 1e5, 1e10, FP32_MAX, math.inf]).repeat(1000)
    big = torch.cat([big, -big])
    out = round_stochastic(big, torch.float16, seeded(12))
    assert torch.equal(out.float(), torch.copysign(torch.full_like(big, math.inf), big)), "|x| >= 65536 -> inf"
    top = round_stochastic(torch.full((10000,), FP16_MAX), torch.float16, seeded(13))
    assert bool((top == FP16_MAX).all()), "the largest finite stays finite"
    # Round-to-nearest sends 65519 to 65504; stochastic rounding sends it to inf with probability 15/32.
    band = round_stochastic(torch.full((10000,), 65519.0), torch.float16, seeded(14))
    assert set(band.float().unique().tolist()) == {FP16_MAX, math.inf}


def test_bf16_overflow_policy() -> None:
    x = torch.tensor([BF16_MAX, -BF16_MAX]).repeat(1000)
    assert torch.equal(round_stochastic(x, torch.bfloat16, seeded(15)).float(), x)
    above = round_stochastic(torch.full((10000,), BF16_MAX * (1 + 2.0**-9)), torch.bfloat16, seeded(16))
    assert set(above.float().unique().tolist()) == {BF16_MAX, math.inf}


@pytest.mark.parametrize("dtype", DTYPES)
def test_seeded(dtype: torch.dtype) -> None:
    x = torch.randn(100_000, generator=seeded(17))
    a = round_stochastic(x, dtype, seeded(18))
    assert torch.equal(a, round_stochastic(x, dtype, seeded(18)))
    b = round_stochastic(x, dtype, seeded(19))
    assert not torch.equal(a, b)
    assert float((a != b).float().mean()) > 0.2
    torch.manual_seed(20)
    c = round_stochastic(x, dtype)
    torch.manual_seed(20)
    assert torch.equal(c, round_stochastic(x, dtype))
    assert not torch.equal(c, round_stochastic(x, dtype))  # the default generator moved on


@pytest.mark.parametrize("dtype", DTYPES)
def test_result_does_not_depend_on_layout_or_chunking(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(300, 1001, generator=seeded(21)) * 1e-3
    expected = round_stochastic(x, dtype, seeded(22))
    assert expected.shape == x.shape and expected.device == x.device
    monkeypatch.setattr(sr, "_CPU_CHUNK", 4096)  # 74 chunks, the last one short
    assert torch.equal(round_stochastic(x, dtype, seeded(22)), expected)
    monkeypatch.setattr(sr, "_CPU_CHUNK", 1 << 30)  # one chunk
    assert torch.equal(round_stochastic(x, dtype, seeded(22)), expected)
    # A transposed (non-contiguous) input rounds like its contiguous copy.
    xt = x.t()
    assert torch.equal(round_stochastic(xt, dtype, seeded(23)), round_stochastic(xt.contiguous(), dtype, seeded(23)))
    assert round_stochastic(torch.tensor(1.5), dtype).shape == ()
    assert round_stochastic(torch.empty(0, 3), dtype).shape == (0, 3)


def test_rejects_other_dtypes() -> None:
    with pytest.raises(TypeError, match="float32"):
        round_stochastic(torch.ones(3, dtype=torch.float16), torch.float16)
    with pytest.raises(ValueError, match="bfloat16"):
        round_stochastic(torch.ones(3), torch.float32)


def test_works_on_parameters_that_require_grad() -> None:
    w = torch.nn.Parameter(torch.randn(10))
    out = round_stochastic(w, torch.bfloat16, seeded(24))
    assert not out.requires_grad and out.dtype == torch.bfloat16


def test_the_stall_fp16() -> None:
    """1000 updates of 1e-4 (below half an fp16 ulp at 1, 4.9e-4) to 10k weights at 1.0."""
    start = torch.ones(10_000)
    reference = accumulate_small_updates(start, 1e-4, 1000, torch.float32, stochastic=False)
    assert abs(float(reference[0]) - 1.1) < 1e-4
    nearest = accumulate_small_updates(start, 1e-4, 1000, torch.float16, stochastic=False)
    assert bool((nearest == 1.0).all()), "round-to-nearest never moves the weights"
    stochastic = accumulate_small_updates(start, 1e-4, 1000, torch.float16, stochastic=True, generator=seeded(25))
    assert stochastic.dtype == torch.float16
    mean = float(stochastic.double().mean())
    assert abs(mean - float(reference[0])) < 1e-3  # standard error ~1e-4
    assert float(stochastic.double().std()) < 0.03  # each weight wanders ~0.01 around 1.1


def test_the_stall_bf16() -> None:
    """300 updates of 1e-3 (below half a bf16 ulp at 1, 3.9e-3)."""
    start = torch.ones(10_000)
    nearest = accumulate_small_updates(start, 1e-3, 300, torch.bfloat16, stochastic=False)
    assert bool((nearest == 1.0).all())
    stochastic = accumulate_small_updates(start, 1e-3, 300, torch.bfloat16, stochastic=True, generator=seeded(26))
    assert abs(float(stochastic.double().mean()) - 1.3) < 3e-3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda(dtype: torch.dtype) -> None:
    x = all_values(dtype).cuda()
    g = torch.Generator(device="cuda").manual_seed(27)
    assert torch.equal(round_stochastic(x, dtype, g).view(torch.int16), x.to(dtype).view(torch.int16))
    value, n = CASES[dtype][0][0], 1 << 20
    xs = torch.full((n,), value, device="cuda")
    out = round_stochastic(xs, dtype, torch.Generator(device="cuda").manual_seed(28))
    assert out.device == xs.device
    again = round_stochastic(xs, dtype, torch.Generator(device="cuda").manual_seed(28))
    assert torch.equal(out, again)
    p = probability_up(xs[:1].cpu(), dtype).item()
    ups = int((out.float() > value).sum())
    assert abs(z_score(ups, n, p)) < Z_LIMIT
    tiny = torch.full((n,), 0.37 * FP16_TINY, device="cuda")
    if dtype == torch.float16:
        ups = int((round_stochastic(tiny, dtype, g) > 0).sum())
        assert abs(z_score(ups, n, 0.37)) < Z_LIMIT
