"""Stochastic rounding of fp32 tensors to fp16 or bf16, unbiased over the whole range.

Round-to-nearest drops any update smaller than half an ulp of the weight, so fp16/bf16 master weights stall under
many small SGD steps (``accumulate_small_updates`` shows it). Stochastic rounding picks the upper neighbour with
probability equal to the fractional position between the two neighbours, so E[round(x)] = x and small updates
survive on average.
"""

from __future__ import annotations

import torch

__all__ = ["accumulate_small_updates", "round_stochastic"]

_SIGN_OFF = 0x7FFFFFFF  # int32 mask that clears the fp32 sign bit
_FP32_INF = 0x7F800000  # fp32 +inf bit pattern
_FP16_TINY = 0x33800000  # 2**-24, the smallest fp16 subnormal, as an fp32 bit pattern (biased exponent 103)
_FP16_OVERFLOW = 0x47800000  # 2**16 = 65536, the first grid step above fp16's largest finite 65504 (exponent 143)
_TINY_BITS = 30  # random bits that decide the fate of a value below 2**-24
_CPU_CHUNK = 1 << 17  # elements per chunk on the CPU: the four int32 scratch buffers take 2 MiB


def round_stochastic(x: torch.Tensor, dtype: torch.dtype, generator: torch.Generator | None = None) -> torch.Tensor:
    """Round the fp32 tensor ``x`` stochastically to ``dtype`` (torch.float16 or torch.bfloat16).

    Each element becomes one of its two neighbours in ``dtype``, lo <= |x| < hi, taking hi with probability
    (|x| - lo) / (hi - lo), so the result is unbiased. Values representable in ``dtype`` come back unchanged, NaN
    stays NaN, +-inf stays +-inf, and the sign is kept (-x rounds as the mirror of x, zeros included). Returns a
    new tensor of ``dtype`` with x's shape and device. The random bits come from ``generator`` (a torch.Generator
    on x's device; None uses torch's default generator), one draw per element, so the same seed gives the same
    result.

    Method: within a binade the int32 bit pattern of |x| is a fixed-point number, so adding k uniform random
    bits to the k pattern bits below the target grid and then clearing them rounds up exactly when the sum
    carries, i.e. with probability (dropped bits) / 2**k; a carry out of the mantissa lands on the next binade,
    which is the right neighbour by construction. Every dropped bit takes part, so P(up) is exact:

    * bf16 has fp32's exponent range: k = 16 everywhere, bf16 subnormals (a subset of fp32's) included.
    * fp16 normals, |x| in [2**-14, 65536): k = 13. fp16 subnormals, |x| in [2**-24, 2**-14), are spaced
      2**-24 while fp32 keeps 23 bits below the leading bit: k = 126 - (biased fp32 exponent), 14 to 23.
      (The familiar alternative, scaling by 2**-112 so that fp16 subnormals land on fp32 subnormals and then
      always dropping 13 bits, is not exact there: the scaled fp32 subnormal has room for only 13 bits below
      the fp16 grid, so the multiply itself rounds the rest to nearest, and anything below 2**-38 always
      becomes 0.)
    * |x| < 2**-24 becomes 0 or 2**-24: 2**-24 when r < floor(|x| * 2**54) for a uniform 30-bit r, so P(up)
      is |x| * 2**24 cut to a multiple of 2**-30. This is the one approximation, a bias below 2**-54 in
      absolute value (no fixed number of random bits is exact here: P(up) goes down to 2**-125).

    Overflow policy: no saturation. For fp16, 65536 = 2**16 is the grid step after the largest finite 65504,
    and fp16 spells it inf, as IEEE round-to-nearest (which overflows from 65520 on) does: |x| in (65504, 65536)
    becomes +-inf with probability (|x| - 65504) / 32 and +-65504 otherwise; |x| >= 65536 always becomes +-inf.
    bf16 ends the same way: |x| above its largest finite 0x1.fep127 becomes +-inf with probability
    (|x| - 0x1.fep127) / 2**120.

    Cost: one random draw and about twenty in-place elementwise passes over int32 views; on the CPU they run
    over chunks small enough to stay in cache (the result does not depend on the chunking). Subnormal results
    assume denormals are not flushed (``torch.set_flush_denormal(False)``, the default).
    """
    if x.dtype != torch.float32:
        raise TypeError(f"round_stochastic rounds float32 tensors; got {x.dtype}")
    if dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"round_stochastic rounds to torch.float16 or torch.bfloat16; got {dtype}")
    with torch.no_grad():
        x = x.detach()
        out = torch.empty(x.shape, dtype=dtype, device=x.device)
        flat_x, flat_out = x.contiguous().view(-1), out.view(-1)
        chunk = _CPU_CHUNK if x.device.type == "cpu" else max(flat_x.numel(), 1)
        scratch = torch.empty((4, min(chunk, flat_x.numel())), dtype=torch.int32, device=x.device)
        ones = torch.full((), -(1 << _TINY_BITS), dtype=torch.int32, device=x.device)  # ones from bit 30 up
        for start in range(0, flat_x.numel(), chunk):
            xs = flat_x[start : start + chunk]
            r, a, t, work = scratch[:, : xs.numel()]
            _round_chunk(xs, flat_out[start : start + chunk], r, a, t, work, ones, generator)
        return out


def _round_chunk(
    x: torch.Tensor,
    out: torch.Tensor,
    r: torch.Tensor,
    a: torch.Tensor,
    t: torch.Tensor,
    work: torch.Tensor,
    ones: torch.Tensor,
    generator: torch.Generator | None,
) -> None:
    """Round the 1-d fp32 ``x`` into ``out`` (fp16 or bf16); ``r``, ``a``, ``t``, ``work`` are int32 scratch."""
    r.random_(generator=generator)  # 31 uniform bits: random_() on int32 draws from [0, 2**31), fast on the CPU
    torch.bitwise_and(x.view(torch.int32), _SIGN_OFF, out=a)  # |x| as bits
    if out.dtype == torch.bfloat16:
        torch.clamp(a, max=_FP32_INF, out=t)  # NaN -> inf (restored below), so the addition cannot overflow
        t.add_(r.bitwise_right_shift_(15)).bitwise_and_(-(1 << 16))  # k = 16
    else:
        _round_fp16_bits(a, r, t, work, ones)
    # min(t, |x| + inf) is t, except NaN where x is NaN: the bit arithmetic has turned NaN into inf.
    rounded = t.view(torch.float32)
    torch.minimum(rounded, a.view(torch.float32).add_(float("inf")), out=rounded)
    torch.copysign(rounded, x, out=rounded)
    out.copy_(rounded)  # exact: on the dtype grid, or inf/NaN


def _round_fp16_bits(a: torch.Tensor, r: torch.Tensor, t: torch.Tensor, work: torch.Tensor, ones: torch.Tensor) -> None:
    """Write into ``t`` the |x| bits ``a`` rounded stochastically to the fp16 grid, as fp32 bits (65536 for inf).

    ``r`` holds 31 random bits per element; ``r`` and ``work`` are overwritten, ``a`` is not.
    """
    r.bitwise_right_shift_(1)  # 30 bits
    # Below 2**-24 the grid is {0, 2**-24}. Up when r < floor(|x| * 2**54): probability |x| * 2**24 to 30 bits.
    # From 2**-24 on the threshold is 2**-24 * 2**54 = 2**30 > r: always "up". r - threshold < 0 exactly when
    # up; the arithmetic shift spreads its sign over all 32 bits, a mask that keeps or zeroes the element.
    torch.clamp(a, max=_FP16_TINY, out=work)
    t.copy_(work.view(torch.float32).mul_(2.0 ** (24 + _TINY_BITS)))  # float -> int32 truncates: the floor
    up = torch.sub(r, t, out=work).bitwise_right_shift_(31)
    # Values below 2**-24 start from 2**-24 and those from 65536 on (NaN and inf too) from 65536, which the
    # rounding leaves as they are; 65536 becomes inf in fp16. The tiny ones that do not go up become 0.
    torch.clamp(a, _FP16_TINY, _FP16_OVERFLOW, out=t).bitwise_and_(up)
    # Add k random bits below the fp16 grid and clear them: k = 23 at 2**-24, falling to 13 from 2**-14 on,
    # k = 23 - clamp(biased exponent - 103, 0, 10). With a 30-bit r that is r >> (30 - k), where
    # 30 - k = clamp(biased exponent - 96, 7, 17); an element zeroed above has exponent 0 and stays 0.
    shift = torch.bitwise_right_shift(t, 23, out=work).sub_(96).clamp_(7, 17)
    t.add_(r.bitwise_right_shift_(shift))
    t.bitwise_and_(torch.bitwise_right_shift(ones, shift, out=shift))  # ones from bit k up


def accumulate_small_updates(
    start: torch.Tensor,
    step: float | torch.Tensor,
    count: int,
    dtype: torch.dtype,
    stochastic: bool,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Apply ``count`` updates ``w <- w + step`` to weights stored in ``dtype``; return the final weights.

    The weights start as ``start`` rounded to nearest in ``dtype``. Each update is computed in fp32 (as an
    optimizer with low-precision master weights does) and stored back in ``dtype`` by round-to-nearest
    (``stochastic=False``) or by ``round_stochastic`` with ``generator``. With a step below half an ulp of the
    weights, round-to-nearest never moves them (the stall), while stochastic rounding tracks
    ``start + count * step`` on average. ``dtype=torch.float32`` with ``stochastic=False`` gives the fp32
    reference. ``step`` may be a float or a tensor broadcastable to ``start``.
    """
    if count < 0:
        raise ValueError(f"count must be >= 0; got {count}")
    w = start.to(dtype)
    for _ in range(count):
        w32 = w.float() + step
        w = round_stochastic(w32, dtype, generator) if stochastic else w32.to(dtype)
    return w
