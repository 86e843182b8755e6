"""build.quantize.nvfp4's compiled NVFP4 loops against compressed-tensors' own calls (`generate_gparam`,
`calculate_qparams`, `NVFP4PackedCompressor.compress` on the CPU), byte for byte: rounding ties in both directions,
signed zeros, values that round to zero, all-zero blocks (the eps scale), subnormal FP8 scales, huge and tiny weights,
fused groups of several members, bfloat16 and float32 inputs; and the FP8 E4M3 rounding against torch's conversion on
every code, every midpoint and millions of other values. Needs the build environment (make build-env)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("compressed_tensors.entrypoints.convert.converters.magnitude_expert_pruner",
                    reason="the reference is compressed-tensors 0.20 (make build-env)")
pytest.importorskip("numba", reason="build.quantize.nvfp4 compiles with numba (make build-env)")

import torch  # noqa: E402

from build.quantize import nvfp4  # noqa: E402

TIES = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -1.25, -0.0, 0.0, -0.1, 0.1, -5.0])


def library(group: list[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """One fused group as the library quantises it (its CPU fallbacks): packed codes, FP8 block scales, global."""
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam

    scheme = preset_name_to_scheme("NVFP4A16", ["Linear"])
    group = [w.float() for w in group]
    g = generate_gparam(torch.stack([w.min() for w in group]).min().reshape(1),
                        torch.stack([w.max() for w in group]).max().reshape(1))
    out = []
    for w in group:
        blocks = w.reshape(w.shape[0], -1, 16)
        scale, _ = calculate_qparams(blocks.amin(-1), blocks.amax(-1), scheme.weights, global_scale=g)
        state = NVFP4PackedCompressor.compress({"weight": w, "weight_scale": scale, "weight_global_scale": g}, scheme)
        out.append((state["weight_packed"], state["weight_scale"], g))
    return out


def groups() -> list[list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    return [
        [torch.randn(64, 256, generator=gen), torch.randn(32, 256, generator=gen) * 3],  # gate/up: one global
        [torch.randn(64, 256, generator=gen) * 0.02],
        [TIES.repeat(8, 4)],  # block amax 6 and global 448: the weights are the scaled values, every tie exact
        [TIES.repeat(8, 4) * 2.0 ** -12],  # the same ties under a power-of-two scale
        [torch.zeros(4, 32)],  # zero blocks: the eps scale
        [torch.cat([torch.zeros(2, 16), torch.randn(2, 16, generator=gen)], 1)],
        [torch.cat([torch.randn(4, 16, generator=gen), torch.randn(4, 16, generator=gen) * 1e-4], 1)],  # FP8 subnormal
        [torch.randn(8, 64, generator=gen) * 1e-30, torch.randn(8, 64, generator=gen) * 1e30],
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_codes_scales_and_global_scales_equal_the_librarys(dtype):
    cases = groups()
    members = [(i, w.to(dtype)) for i, group in enumerate(cases) for w in group]
    flat = np.concatenate([(w.view(torch.uint16) if dtype == torch.bfloat16 else w).numpy().reshape(-1)
                           for _, w in members])
    starts = np.cumsum([0] + [w.numel() for _, w in members])[:-1]
    q = nvfp4.quantize(flat, starts, [w.shape[0] for _, w in members], [w.shape[1] for _, w in members],
                       [i for i, _ in members], [str(i) for i in range(len(members))], error=True)
    i = 0
    for group in cases:
        for packed, scale, g in library([w.to(dtype) for w in group]):
            at = int(q.scales_at[i])
            assert np.array_equal(q.packed[at * 8:at * 8 + packed.numel()], packed.numpy().reshape(-1)), i
            assert np.array_equal(q.scales[at:at + scale.numel()], scale.view(torch.uint8).numpy().reshape(-1)), i
            assert q.global_scales[i] == g.item(), i
            i += 1
    assert i == len(members)
    relative = np.sqrt(q.errors[:, 0]) / np.maximum(np.sqrt(q.errors[:, 1]), 1e-12)
    assert 0.05 < relative[0] < 0.15 and relative[5] == 0.0  # random weights; the all-zero weight


def test_e4m3_rounding_is_torchs_on_every_code_midpoint_and_random_value():
    from numba import njit

    @njit
    def convert(values):
        codes = np.empty(values.shape[0], np.uint8)
        nvfp4._to_e4m3(values, codes)
        return codes

    exact = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    assert np.array_equal(nvfp4.E4M3_VALUES, exact.numpy())
    midpoints = (exact[1:] + exact[:-1]) / 2
    gen = torch.Generator().manual_seed(0)
    values = torch.cat([exact, midpoints, torch.nextafter(midpoints, torch.tensor(1e9)),
                        torch.nextafter(midpoints, torch.tensor(-1.0)).clamp(min=0),
                        torch.rand(2_000_000, generator=gen) * 448,
                        torch.exp2(torch.rand(2_000_000, generator=gen) * 30 - 30)]).clamp(0, 448)
    expected = values.to(torch.float8_e4m3fn).view(torch.uint8).clone()
    expected[expected == 0] = nvfp4.FP8_EPS_CODE  # a zero scale becomes eps, as calculate_qparams does
    assert np.array_equal(convert(values.numpy()), expected.numpy())


def test_a_nan_or_an_infinity_is_refused_by_name():
    w = np.ones(64, dtype=np.float32)
    w[40] = np.inf
    with pytest.raises(ValueError, match=r"NaN or infinite values, e\.g\. \['second'\]"):
        nvfp4.quantize(w, [0, 32], [1, 1], [32, 32], [0, 1], ["first", "second"])
    w[40] = np.nan
    with pytest.raises(ValueError, match="second"):
        nvfp4.quantize(w, [0, 32], [1, 1], [32, 32], [0, 1], ["first", "second"])
    with pytest.raises(ValueError, match="multiple of 16 columns"):
        nvfp4.quantize(w, [0], [2], [24], [0], ["odd"])
