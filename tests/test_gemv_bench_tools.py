"""The GEMV benchmark tools, the parts that run without a GPU: ``kernels_bench.py graphs``'
best sweep variant (or each problem's) read from a sweep's JSON and the engine's 1-2 row
dispatch patched to it."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from tests.helpers import BENCHMARKS

sys.path.insert(0, str(BENCHMARKS))

from lib import decode_graphs, w4a16_variants  # noqa: E402


def _row(m, shape, res):
    return {"m": m, "shape": shape,
            "res": {v: {"speedup": x, "err": e} for v, (x, e) in res.items()}}


def test_best_variant_takes_the_geomean_over_every_shape(tmp_path):
    rows = [
        _row(1, "a", {"auto": (9.0, 0), "p": (2.0, 1e-3), "q": (4.0, 1e-3), "r": (9.0, 1e-3)}),
        _row(1, "b", {"auto": (9.0, 0), "p": (2.0, 1e-3), "q": (1.5, 1e-3), "r": (9.0, 0.5)}),
        _row(1, "c", {"auto": (9.0, 0), "p": (2.0, 1e-3), "q": (1.5, 1e-3)}),
        _row(2, "a", {"s": (50.0, 0)}),
    ]
    path = tmp_path / "w4a16_sweep.json"
    path.write_text(json.dumps({"copy_bw": 1.0, "rows": rows}))
    # q's geomean 2.08 beats p's 2.0; r is wrong on b and missing on c; auto and M=2 don't count
    assert decode_graphs.best_variant(path) == "q"
    assert decode_graphs.best_variant(path, m=2) == "s"
    with pytest.raises(SystemExit, match="no variant"):
        decode_graphs.best_variant(path, m=4)


def test_patch_gemv_routes_one_and_two_rows_only(monkeypatch):
    from edge_llm.kernels import w4a16

    monkeypatch.setattr(w4a16, "lookup", w4a16.lookup)  # undone after the test
    before = w4a16.lookup("wgmma", "fp16", 16, 4096, 4096, 128)
    with pytest.raises(SystemExit, match="no sweep candidate"):
        w4a16_variants.patch_gemv("no such variant")
    w4a16_variants.patch_gemv("g16 p4 reduce launch")
    for m in (1, 2):
        cfg = w4a16.lookup("wgmma", "fp16", m, 4096, 4096, 128)
        assert (type(cfg).__name__, cfg.block_n, cfg.block_k, cfg.fold_zero, cfg.pipe_stages,
                cfg.fused_reduce) == ("Gemv16", 64, 128, True, 4, False)
    assert w4a16.lookup("wgmma", "fp16", 16, 4096, 4096, 128) == before
    bf16 = w4a16.lookup("wgmma", "bf16", 1, 4096, 4096, 128)
    assert not bf16.fold_zero  # bf16 keeps its dispatched path
    x = torch.zeros(2, 4096, dtype=torch.float16)  # what prepare (every launch) consults
    qw = torch.zeros(512, 4096, dtype=torch.int32)
    s = torch.ones(32, 4096, dtype=torch.float16)
    assert not w4a16.prepare(x, qw, s, s, 128)[1].fused_reduce


def test_per_shape_patch_takes_each_problems_winner_on_plane_packed_words(monkeypatch):
    from edge_llm.kernels import w4a16

    monkeypatch.setattr(w4a16, "lookup", w4a16.lookup)
    rows = [dict(_row(1, "o", {"auto": (2.0, 0), "g16 bn32 bk128 p4 w4 v2.5": (2.5, 1e-3),
                               "g16 bn128 bk128 p4 w8 v2.5": (3.0, 0.5)}), n=4096, k=4096),
            dict(_row(1, "qkv", {"auto": (2.0, 0), "g16 bn32 bk128 p4 w4 v2.5": (1.5, 1e-3)}),
                 n=12288, k=4096)]
    best = w4a16_variants.best_per_shape(rows)
    # the wrong one (err 0.5) is not taken; where the dispatched choice won it stays
    assert best == {(1, 4096, 4096): "g16 bn32 bk128 p4 w4 v2.5", (1, 12288, 4096): "auto"}
    dispatched = {n: w4a16.lookup("wgmma", "fp16", 1, n, 4096, 128, True) for n in (4096, 12288)}
    two_rows = w4a16.lookup("wgmma", "fp16", 2, 4096, 4096, 128, True)
    w4a16_variants.patch_gemv(best)
    o = w4a16.lookup("wgmma", "fp16", 1, 4096, 4096, 128, True)
    assert (o.block_n, o.block_k, o.pipe_stages, o.num_warps) == (32, 128, 4, 4)
    assert o != dispatched[4096]
    assert w4a16.lookup("wgmma", "fp16", 1, 12288, 4096, 128, True) == dispatched[12288]
    # a problem the sweep did not measure (M=2 here) keeps the dispatched choice
    assert w4a16.lookup("wgmma", "fp16", 2, 4096, 4096, 128, True) == two_rows
