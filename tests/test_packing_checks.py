"""quant/packing.py: what ``QuantizedWeight.validate`` refuses, the input checks of the nibble
packers, and the exact bit layout (nibble j of a word at bits 4j..4j+3, two's complement)."""

from __future__ import annotations

import random

import pytest
import torch

from edge_llm.quant.packing import (
    PACK,
    PLANE_TILE,
    QuantizedWeight,
    pack_int4,
    pack_planes,
    plane_rows,
    sequential_g_idx,
    unpack_int4,
)


def gen(rng: random.Random) -> torch.Generator:
    return torch.Generator().manual_seed(rng.randrange(2**32))


def weight(rng: random.Random, k: int = 32, n: int = 16, group: int = 8) -> QuantizedWeight:
    g = gen(rng)
    groups = k // group
    return QuantizedWeight(
        q=torch.randint(0, 16, (k, n), generator=g, dtype=torch.int32),
        zeros=torch.randint(0, 16, (groups, n), generator=g, dtype=torch.int32),
        scales=torch.rand(groups, n, generator=g) + 0.01,
        g_idx=sequential_g_idx(k, group),
        group_size=group,
    )


# ---- validate ------------------------------------------------------------------------------


def test_a_consistent_weight_passes(rng: random.Random) -> None:
    w = weight(rng)
    w.validate()
    assert (w.in_features, w.out_features) == (32, 16) and w.is_sequential()
    w.q[0, 0], w.q[1, 1], w.zeros[0, 0], w.zeros[1, 1] = 0, 15, 0, 15  # the range is inclusive
    w.validate()


@pytest.mark.parametrize("field, shape", [("zeros", (4, 15)), ("zeros", (3, 16)),
                                          ("scales", (4, 17)), ("scales", (5, 16))])
def test_group_tensors_must_be_g_by_n(rng: random.Random, field: str, shape) -> None:
    w = weight(rng)
    setattr(w, field, torch.zeros(shape, dtype=getattr(w, field).dtype))
    zeros, scales = tuple(w.zeros.shape), tuple(w.scales.shape)
    with pytest.raises(ValueError) as info:
        w.validate()
    assert str(info.value) == (f"zeros {zeros} and scales {scales} must both be (G, N) "
                               f"with N=16.")


def test_g_idx_must_have_one_entry_per_row(rng: random.Random) -> None:
    w = weight(rng)
    w.g_idx = w.g_idx[:-1]
    with pytest.raises(ValueError, match=r"^g_idx has shape \(31,\), expected \(32,\)\.$"):
        w.validate()
    w.g_idx = sequential_g_idx(32, 8).view(4, 8)
    with pytest.raises(ValueError, match=r"g_idx has shape \(4, 8\)"):
        w.validate()


@pytest.mark.parametrize("row, group, found", [(0, -1, "[-1, 3]"), (31, 4, "[0, 4]"),
                                               (5, 9, "[0, 9]")])
def test_g_idx_values_must_name_a_group(rng: random.Random, row: int, group: int,
                                        found: str) -> None:
    w = weight(rng)
    w.g_idx[row] = group
    with pytest.raises(ValueError) as info:
        w.validate()
    assert str(info.value) == f"g_idx values must lie in [0, 4), found {found}."
    w.g_idx[row] = 3  # the last group is valid
    w.validate()


@pytest.mark.parametrize("field", ["q", "zeros"])
@pytest.mark.parametrize("value", [-1, 16, 255])
def test_nibbles_must_lie_in_0_15(rng: random.Random, field: str, value: int) -> None:
    w = weight(rng)
    getattr(w, field)[1, 2] = value
    with pytest.raises(ValueError, match=rf"^{field} values must lie in 0\.\.15\.$"):
        w.validate()


def test_act_order_is_not_sequential_and_dequantizes_by_its_groups(rng: random.Random) -> None:
    w = weight(rng, k=16, n=8, group=8)
    w.g_idx = torch.tensor([1, 0] * 8, dtype=torch.int32)
    w.validate()
    assert not w.is_sequential()
    want = torch.stack([(w.q[k] - w.zeros[int(w.g_idx[k])]).float()
                        * w.scales[int(w.g_idx[k])] for k in range(16)])
    assert torch.equal(w.dequantize(), want)
    assert w.dequantize(torch.float64).dtype == torch.float64


def test_from_rows_transposes_rounds_zeros_and_defaults_g_idx(rng: random.Random) -> None:
    g = gen(rng)
    q = torch.randint(0, 16, (8, 16), generator=g)  # (N, K)
    scales = torch.rand(8, 2, generator=g)
    zeros = torch.tensor([[7.4, 8.6]] * 8)
    w = QuantizedWeight.from_rows(q, scales, zeros, group_size=8)
    w.validate()
    assert w.q.dtype == torch.int32 and w.group_size == 8
    assert torch.equal(w.q, q.t().to(torch.int32)) and w.q.is_contiguous()
    assert w.zeros.tolist() == [[7] * 8, [9] * 8] and w.zeros.dtype == torch.int32
    assert torch.equal(w.g_idx, torch.tensor([0] * 8 + [1] * 8, dtype=torch.int32))
    order = torch.tensor([1, 0] * 8)  # act-order: the given g_idx is kept, as int32
    act = QuantizedWeight.from_rows(q, scales, zeros, 8, order)
    assert act.g_idx.dtype == torch.int32 and act.g_idx.tolist() == order.tolist()


# ---- pack_int4 / unpack_int4 ---------------------------------------------------------------


def test_word_layout_is_nibble_j_at_bits_4j() -> None:
    values = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]], dtype=torch.int32)
    (word,) = pack_int4(values, dim=1).view(-1).tolist()
    bits = sum(v << (4 * j) for j, v in enumerate(range(1, 9)))  # 0x87654321 >= 2**31
    assert word == bits - (1 << 32)
    # a top nibble of 8..15 makes the int32 negative (two's complement), never an overflow
    top = torch.tensor([[0] * 7 + [15]], dtype=torch.int32)
    packed = pack_int4(top, dim=1)
    assert packed.dtype == torch.int32 and packed.item() == -(1 << 28)
    assert pack_int4(torch.full((1, 8), 15), dim=1).item() == -1
    ordered = pack_int4(values, dim=1, order=[1, 0, 2, 3, 4, 5, 6, 7])
    assert ordered.item() == word - (1 << 0) - (2 << 4) + (2 << 0) + (1 << 4)


@pytest.mark.parametrize("dim", [0, 1])
def test_pack_unpack_round_trip(rng: random.Random, dim: int) -> None:
    g = gen(rng)
    shape = (16, 24)
    values = torch.randint(0, 16, shape, generator=g, dtype=torch.int32)
    order = list(range(PACK))
    random.Random(rng.randrange(2**32)).shuffle(order)
    for o in (None, order):
        packed = pack_int4(values, dim, o)
        assert packed.shape[dim] == shape[dim] // PACK and packed.is_contiguous()
        assert packed.shape[1 - dim] == shape[1 - dim]
        assert torch.equal(unpack_int4(packed, dim, o), values)
    if order != list(range(PACK)):
        assert not torch.equal(unpack_int4(pack_int4(values, dim, order), dim), values)


def test_pack_input_checks() -> None:
    with pytest.raises(ValueError, match=r"^Packed dimension 1 has size 12, not a multiple of "
                                         r"8\.$"):
        pack_int4(torch.zeros(8, 12, dtype=torch.int32), dim=1)
    for bad in (-1, 16):
        values = torch.zeros(8, 8, dtype=torch.int32)
        values[3, 4] = bad
        with pytest.raises(ValueError, match=r"^pack_int4 takes values in 0\.\.15\.$"):
            pack_int4(values, dim=0)
    empty = pack_int4(torch.zeros(0, 8, dtype=torch.int32), dim=1)
    assert empty.shape == (0, 1)


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint8, torch.float32])
def test_unpack_takes_int32_words_only(dtype) -> None:
    with pytest.raises(ValueError, match=f"^Packed tensors must be int32, got {dtype}\\.$"):
        unpack_int4(torch.zeros(2, 2, dtype=dtype), dim=0)


# ---- plane packing -------------------------------------------------------------------------


def test_plane_rows_order() -> None:
    rows = plane_rows(2 * PLANE_TILE)
    assert rows.dtype == torch.int64 and sorted(rows.tolist()) == list(range(2 * PLANE_TILE))
    # within a tile, nibble j of word r holds row 16 j + r
    assert rows[:10].tolist() == [0, 16, 32, 48, 64, 80, 96, 112, 1, 17]
    assert rows[PLANE_TILE].item() == PLANE_TILE


def test_pack_planes_moves_rows_to_plane_order(rng: random.Random) -> None:
    k, n = 2 * PLANE_TILE, 8
    q = torch.randint(0, 16, (k, n), generator=gen(rng), dtype=torch.int32)
    words = pack_int4(q, dim=0)
    planes = pack_planes(words)
    assert planes.shape == words.shape and planes.dtype == torch.int32
    assert torch.equal(unpack_int4(planes, dim=0), q[plane_rows(k)])


@pytest.mark.parametrize("rows, dtype", [(PLANE_TILE - PACK, torch.int32),
                                         (PLANE_TILE + PACK, torch.int32),
                                         (PLANE_TILE, torch.int64)])
def test_pack_planes_input_checks(rows: int, dtype) -> None:
    words = torch.zeros(rows // PACK, 4, dtype=dtype)
    with pytest.raises(ValueError, match=f"^pack_planes: int32 words with K a multiple of 128, "
                                         f"got {dtype} K={rows}$"):
        pack_planes(words)


def test_plane_helpers_stay_on_the_device_of_their_input() -> None:
    """The repack runs on the GPU in place of the weights: nothing may fall back to the CPU.
    The "meta" device stands in for CUDA here (shapes and devices, no data)."""
    meta = torch.device("meta")
    assert plane_rows(2 * PLANE_TILE, device=meta).device == meta
    assert sequential_g_idx(64, 8, device=meta).device == meta
    words = torch.empty(2 * PLANE_TILE // PACK, 4, dtype=torch.int32, device=meta)
    out = pack_planes(words)
    assert out.device == meta and out.shape == words.shape and out.dtype == torch.int32
