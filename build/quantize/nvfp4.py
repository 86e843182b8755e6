"""NVFP4 weight quantisation of many rows at once, bit for bit as compressed-tensors 0.20 writes it on the CPU.

Why not the library's own calls: on the CPU its `cast_to_fp4` and `pack_fp4_to_uint8` fall back to eight masked
assignments per element each (~10 M elements/s on one core: ~4 hours for an 80B mixture of experts), every tensor pays
a few dozen small torch calls for its scales, and even a vectorised torch version of the same arithmetic makes ~18
passes over the weights (~100 M elements/s here). Two compiled loops (numba) read the weights twice instead: once for
the block maxima, once to round, pack and measure the error, over all the rows handed in (a shard's expert
projections together), on every core; the FP8 block scales are made in the second loop, rounded to E4M3 as torch
rounds (its conversion's steps on the float32 bits).

The library's steps, each reproduced with the same IEEE operations (tests/test_nvfp4.py compares the bytes with
`generate_gparam`, `calculate_qparams` and `NVFP4PackedCompressor.compress` on ties, signed zeros, zero blocks and
random weights):
- global scale of a fused group: `448 * 6 / max|W|` (the amax clamped to the smallest normal float32; NaN and
  infinities become 1), one per group, shared by its members;
- block scale per 16 weights: `global * (max|block| / 6)`, rounded to FP8 E4M3 (a zero becomes 0.125, FP8's eps);
- values: `W / (block scale / global)`, clamped to +-6 and rounded to the nearest E2M1 value with ties to even (0.25
  -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4), the sign in bit 3 for every negative value
  (one that rounds to 0 too) but not for -0.0 (the library takes the sign from `torch.sign`);
- two codes a byte, element 2i in the low nibble.
Pure: arrays in, arrays out. Weights come as float32 or as bfloat16 bits (uint16: numpy has no bfloat16).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit, prange

FP8_MAX = 448.0
FP4_MAX = 6.0
FP8_EPS = 0.125  # compressed-tensors' replacement for a zero block scale: torch.finfo(float8_e4m3fn).eps
FP8_EPS_CODE = np.uint8(0x20)  # 0.125 = 2^-3 as float8_e4m3fn bits: exponent field 4, mantissa 0
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)
E2M1_SIGNED = np.concatenate([E2M1, -E2M1])  # by code: bit 3 is the sign
# float8_e4m3fn bits 0..126 as the float32 they stand for: m * 2^-9 (subnormal), else (8 + m) * 2^(e - 10)
E4M3_VALUES = np.array([(c & 7) * 2.0 ** -9 if c < 8 else (8 + (c & 7)) * 2.0 ** ((c >> 3) - 10) for c in range(127)],
                       dtype=np.float32)
ROWS_PER_TASK = 64  # rows a thread converts at a time (its scratch row buffer is reused across them)


def global_scale(amax: np.ndarray) -> np.ndarray:
    """Global scales (float32) from each group's max |weight|, as `generate_gparam` computes them (torch's order
    of operations: `2688 / amax` is a reciprocal times 2688 there, so it is here)."""
    import torch

    amax = torch.clamp(torch.from_numpy(np.asarray(amax, dtype=np.float32)), min=torch.finfo(torch.float32).tiny)
    scale = FP8_MAX * FP4_MAX / amax
    return torch.nan_to_num(scale, nan=1.0, posinf=1.0, neginf=1.0).numpy()


@dataclass(frozen=True)
class Quantized:
    """NVFP4 of several weights quantised together, in flat arrays: weight i's block scales (rows x cols/16,
    float8_e4m3fn bits) start at `scales[scales_at[i]]`, its codes (rows x cols/2, two a byte) at
    `packed[8 * scales_at[i]]`; `global_scales[i]` is its group's global scale, `errors[i]` the squared error of its
    dequantised weights and its squared norm (the report's relative error; None unless asked)."""

    packed: np.ndarray
    scales: np.ndarray
    scales_at: np.ndarray
    global_scales: np.ndarray
    errors: np.ndarray | None


def quantize(source: np.ndarray, starts: np.ndarray, rows: np.ndarray, cols: np.ndarray, groups: np.ndarray,
             names: list[str], error: bool = False) -> Quantized:
    """Quantise the weights that lie in `source` (flat: float32, or bfloat16 bits as uint16) at element offsets
    `starts`, each `rows[i]` x `cols[i]` (cols a multiple of 16); `groups[i]` numbers the fused group of weight i, whose
    members share one global scale (every member of a group must be among the weights); `names` name them in errors
    (a weight holding a NaN or an infinity is refused: the library would write garbage). Memory: the outputs (~0.28x
    the bfloat16 input's bytes), the block maxima (~0.13x) and a row per core; nothing is copied from `source`."""
    starts, rows, cols, groups = (np.asarray(a, dtype=np.int64) for a in (starts, rows, cols, groups))
    if np.any(cols % 16):
        raise ValueError(f"NVFP4 needs a multiple of 16 columns, got {sorted(set(cols[cols % 16 != 0].tolist()))}")
    if source.dtype not in (np.float32, np.uint16):
        raise ValueError(f"NVFP4 weights must be float32 or bfloat16 bits (uint16), got {source.dtype}")
    bits, shift = (source.view(np.uint32), 0) if source.dtype == np.float32 else (source, 16)
    blocks = rows * cols // 16
    scales_at = np.concatenate([[0], np.cumsum(blocks)[:-1]]).astype(np.int64)
    amax_blocks = np.empty(int(blocks.sum()), dtype=np.uint32)
    amax = np.full(len(rows), -np.inf, dtype=np.float32)
    packed = np.empty(int(blocks.sum()) * 8, dtype=np.uint8)
    scales = np.empty(int(blocks.sum()), dtype=np.uint8)
    task_member, task_row = _tasks(np.arange(len(rows)), rows)
    task_amax = np.zeros(len(task_member), dtype=np.uint32)
    _block_amax(bits, shift, starts, rows, cols, scales_at, task_member, task_row, amax_blocks, task_amax)
    with np.errstate(invalid="ignore"):  # a NaN propagates, to be refused just below
        np.maximum.at(amax, task_member, task_amax.view(np.float32))
    bad = [names[i] for i in np.flatnonzero(~np.isfinite(amax) & (blocks > 0))]
    if bad:
        raise ValueError(f"{len(bad)} weight(s) hold NaN or infinite values, e.g. {bad[:3]}: not quantised")
    group_amax = np.zeros(int(groups.max(initial=-1)) + 1, dtype=np.float32)
    np.maximum.at(group_amax, groups, np.maximum(amax, 0))
    global_scales = global_scale(group_amax)[groups].astype(np.float32)
    task_errors = np.zeros((len(task_member) if error else 0, 2), dtype=np.float64)
    _pack(bits, shift, starts, rows, cols, scales_at, task_member, task_row, amax_blocks.view(np.float32),
          global_scales, scales, packed, task_errors, error)
    errors = None
    if error:
        errors = np.zeros((len(rows), 2), dtype=np.float64)
        np.add.at(errors, task_member, task_errors)
    return Quantized(packed, scales, scales_at, global_scales, errors)


def _tasks(members: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The parallel loops' tasks: each member's rows in runs of ROWS_PER_TASK, as (member, first row) arrays."""
    per_member = (rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    task_member = np.repeat(members, per_member)
    first = np.repeat(np.cumsum(per_member) - per_member, per_member)
    return task_member, (np.arange(len(task_member)) - first) * ROWS_PER_TASK


@njit(inline="always")
def _widen(source, start, count, shift, bits):
    """`count` weights from `source[start:]` widened to float32 bits into `bits` (a uint32 view of a float32 row)."""
    for j in range(count):
        bits[j] = np.uint32(source[start + j]) << np.uint32(shift)


@njit(cache=True, parallel=True, error_model="numpy")
def _block_amax(source, shift, starts, rows, cols, scales_at, task_member, task_row, out, task_out):
    """max |x| of every block of 16, on the bits: without the sign bit a float's bits order as its magnitude does (a
    NaN's are above infinity's, so a NaN wins), and `out` (uint32) receives them as float32 bits."""
    magnitude = np.uint32(0x7FFFFFFF) >> np.uint32(shift)
    for task in prange(task_member.shape[0]):
        member = task_member[task]
        columns = cols[member]
        for r in range(task_row[task], min(rows[member], task_row[task] + ROWS_PER_TASK)):
            row = starts[member] + r * columns
            at = scales_at[member] + r * (columns // 16)
            for b in range(columns // 16):
                best = np.uint32(0)
                for j in range(row + b * 16, row + b * 16 + 16):
                    best = max(best, np.uint32(source[j]) & magnitude)
                out[at + b] = best << np.uint32(shift)
                task_out[task] = max(task_out[task], best << np.uint32(shift))


@njit(cache=True, parallel=True, error_model="numpy")
def _pack(source, shift, starts, rows, cols, scales_at, task_member, task_row, amax, global_scales, scales, packed,
          errors, error):
    for task in prange(task_member.shape[0]):
        member = task_member[task]
        columns = cols[member]
        first, last = task_row[task], min(rows[member], task_row[task] + ROWS_PER_TASK)
        at = scales_at[member] + first * (columns // 16)  # the task's blocks are contiguous
        divisors = _block_scales(amax[at:at + (last - first) * (columns // 16)], global_scales[member],
                                 scales[at:at + (last - first) * (columns // 16)])
        x = np.empty(columns, dtype=np.float32)  # one row as float32, written through its bits
        bits = x.view(np.uint32)
        codes = np.empty(columns, dtype=np.uint8)
        squared_error, squared_norm = 0.0, 0.0
        for r in range(first, last):
            _widen(source, starts[member] + r * columns, columns, shift, bits)
            row_at = (r - first) * (columns // 16)
            for b in range(columns // 16):
                divisor = divisors[row_at + b]
                for j in range(b * 16, b * 16 + 16):
                    codes[j] = _code(x[j] / divisor)
            out = (at + row_at) * 8
            for k in range(columns // 2):
                packed[out + k] = codes[2 * k] | (codes[2 * k + 1] << np.uint8(4))
            if error:  # per block in units of its divisor, in float32 (vectorises; no overflow), summed in float64
                for b in range(columns // 16):
                    divisor = divisors[row_at + b]
                    block_error, block_norm = np.float32(0.0), np.float32(0.0)
                    for j in range(b * 16, b * 16 + 16):
                        scaled = x[j] / divisor
                        block_error += (E2M1_SIGNED[codes[j]] - scaled) * (E2M1_SIGNED[codes[j]] - scaled)
                        block_norm += scaled * scaled
                    squared_error += np.float64(block_error) * np.float64(divisor) ** 2
                    squared_norm += np.float64(block_norm) * np.float64(divisor) ** 2
        if error:
            errors[task, 0] = squared_error
            errors[task, 1] = squared_norm


@njit(inline="always")
def _block_scales(amax, g, scales):
    """The FP8 block scales of `amax` (blocks of one weight, global scale g) into `scales` as float8_e4m3fn bits, and
    each block's divisor `scale / g` (float32): calculate_qparams' `g * (amax / 6)`, clamped to FP8's range, rounded
    to E4M3, a zero replaced by FP8's eps. Simple loops, so that they vectorise."""
    count = amax.shape[0]
    wanted = np.empty(count, dtype=np.float32)
    for b in range(count):
        wanted[b] = min(max(g * (amax[b] / np.float32(FP4_MAX)), np.float32(-FP8_MAX)), np.float32(FP8_MAX))
    _to_e4m3(wanted, scales)
    divisors = np.empty(count, dtype=np.float32)
    for b in range(count):
        divisors[b] = E4M3_VALUES[scales[b]] / g  # the quantiser's `scale / global_scale`
    return divisors


@njit(inline="always")
def _to_e4m3(wanted, codes):
    """Non-negative float32 values at most 448 as float8_e4m3fn bits, a zero as FP8's eps: torch's conversion
    (c10/util/Float8_e4m3fn.h `fp8e4m3fn_from_fp32_value`) step for step on the float32 bits, to nearest even;
    below 2^-6 by adding 2^14 in float32, which rounds to a multiple of 2^-9."""
    rounded = np.empty(wanted.shape[0], dtype=np.float32)
    for b in range(wanted.shape[0]):
        rounded[b] = wanted[b] + np.float32(2.0 ** 14)
    wanted_bits, rounded_bits = wanted.view(np.uint32), rounded.view(np.uint32)
    for b in range(wanted.shape[0]):
        bits = wanted_bits[b]
        normal = (bits + np.uint32(2 ** 32 - (120 << 23)) + np.uint32(0x7FFFF) + ((bits >> np.uint32(20)) & np.uint32(1))
                  ) >> np.uint32(20)  # + ((7 - 127) << 23) in uint32 arithmetic: the mantissa to 3 bits, to even
        subnormal = rounded_bits[b] - np.uint32(141 << 23)
        code = np.uint8((subnormal if bits < np.uint32(121 << 23) else normal) & np.uint32(0xFF))
        codes[b] = FP8_EPS_CODE if code == 0 else code


@njit(inline="always")
def _code(scaled):
    """The E2M1 code of one scaled weight: the count of thresholds its magnitude passes (ties to even), the sign in
    bit 3 for a negative value (-0.0 is not negative)."""
    m = abs(scaled)
    code = ((m > 0.25) + (m >= 0.75) + (m > 1.25) + (m >= 1.75) + (m > 2.5) + (m >= 3.5) + (m > 5.0)
            + 8 * (scaled < 0))
    return np.uint8(code)
