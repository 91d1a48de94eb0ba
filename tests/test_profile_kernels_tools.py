"""``kernels_bench.py profile``'s parts that run without a GPU: the kernel tally from an
ordered launch list, the one-row GEMV's launches grouped by their place in a decoder layer,
and the bytes each linear of a layer must read (what its fraction of copy bandwidth is of)."""

from __future__ import annotations

import json
import sys

import pytest

from tests.helpers import BENCHMARKS

sys.path.insert(0, str(BENCHMARKS))

from lib import profile_kernels as pk  # noqa: E402
from random_checkpoint import SHAPES  # noqa: E402


def test_tally_and_positions_of_the_gemv():
    # two steps of a two-layer model: per layer qkv 10, o 4, gate_up 16, down 8 us, plus a norm
    layer = [(pk.GEMV, 10.0), ("norm", 1.0), (pk.GEMV, 4.0), (pk.GEMV, 16.0), (pk.GEMV, 8.0)]
    launches = (layer + layer) * 2
    launches[5] = (pk.GEMV, 12.0)  # the second layer's qkv of the first step
    tally = pk.kernel_tally(launches)
    assert tally == {pk.GEMV: [16, 4 * 38.0 + 2.0], "norm": [4, 4.0]}
    gemv = [us for name, us in launches if name == pk.GEMV]
    assert pk.by_layer_position(gemv, layers=2, steps=2) == [10.5, 4.0, 16.0, 8.0]
    assert pk.by_layer_position(gemv[:-1], layers=2, steps=2) is None  # one launch missing
    assert pk.by_layer_position([], layers=2, steps=2) is None


def test_layer_linear_bytes_and_the_table(tmp_path):
    from edge_llm.model.arch import parse_arch_config

    arch = parse_arch_config(SHAPES["llama2-7b"])
    qkv, o, gate_up, down = pk.layer_linear_bytes(arch, 128)
    assert qkv == 4096 * 12288 // 2 + 4 * 32 * 12288  # words, fp16 scales and zero points
    assert (o, gate_up, down) == (4096 * 4096 // 2 + 4 * 32 * 4096,
                                  4096 * 22016 // 2 + 4 * 32 * 22016,
                                  11008 * 4096 // 2 + 4 * 86 * 4096)
    text = pk.gemv_table([qkv / 3000e3, 4.0, 8.0, 8.0], [qkv, o, gate_up, down], 3000.0)
    assert text.splitlines()[1] == "  qkv: 8.91 1.00"  # qkv bytes in qkv / 3 TB/s: all of it
    assert text.splitlines()[2] == "  o: 4.00 0.74"  # 8.9 MB in 4 us: 2.2 of 3 TB/s
    assert pk.gemv_table([1.0, 2.0], None, 0.0).splitlines()[1:] == ["  0: 1.00", "  1: 2.00"]
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(
        {**SHAPES["llama2-7b"], "quantization_config": {"quant_method": "awq", "bits": 4,
                                                        "group_size": 128}}))
    assert pk._gemv_bytes(ckpt) == [qkv, o, gate_up, down]
    (ckpt / "config.json").write_text(json.dumps(SHAPES["llama2-7b"]))
    assert pk._gemv_bytes(ckpt) is None


@pytest.mark.parametrize("shape", ["qwen2.5-7b"])
def test_layer_linear_bytes_with_grouped_query_attention(shape):
    from edge_llm.model.arch import parse_arch_config

    arch = parse_arch_config(SHAPES[shape])  # 28 query heads, 4 kv heads of 128
    assert pk.layer_linear_bytes(arch, 128)[0] == 3584 * 4608 // 2 + 4 * 28 * 4608


def test_the_critical_path_charges_each_kernel_what_the_stream_waited_for():
    spans = [("norm", 0.0, 2.0),
             (pk.GEMV, 1.0, 10.0),  # started early (PDL), done 8 us after the norm
             ("rotary", 9.0, 11.5),  # inside the GEMV's tail: 1.5 us of its own
             ("attention", 14.0, 20.0),  # after 2.5 us with nothing running
             ("copy", 15.0, 19.0)]  # overlapped entirely: adds nothing
    shares, idle = pk.critical_path(spans)
    assert shares == [("norm", 2.0), (pk.GEMV, 8.0), ("rotary", 1.5), ("attention", 6.0),
                      ("copy", 0.0)]
    assert idle == 2.5
    assert sum(us for _, us in shares) + idle == spans[-2][2] - spans[0][1]  # the whole span
    durations = sum(end - start for _, start, end in spans)
    assert durations > 20.0  # the kernels' own durations overcount the overlapped span
    assert pk.critical_path([]) == ([], 0.0)
