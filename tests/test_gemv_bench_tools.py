"""The GEMV benchmark tools, the parts that run without a GPU: ``kernels_bench.py graphs``'
best sweep variant read from a sweep's JSON and the engine's 1-2 row dispatch patched to it."""

from __future__ import annotations

import json
import sys

import pytest

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

    monkeypatch.setattr(w4a16, "pick_config", w4a16.pick_config)  # undone after the test
    before = w4a16.pick_config(16, 4096, 4096, 128, 132, half=True, fp16=True)
    with pytest.raises(KeyError):
        w4a16_variants.patch_gemv("no such variant")
    w4a16_variants.patch_gemv("g16 bn64 bk128 flat fold p4")
    for m in (1, 2):
        cfg = w4a16.pick_config(m, 4096, 4096, 128, 132, half=True, fp16=True)
        assert (cfg.kind, cfg.block_n, cfg.block_k, cfg.rows, cfg.fold_zero,
                cfg.pipe_stages) == ("gemv16", 64, 128, m, True, 4)
    assert w4a16.pick_config(16, 4096, 4096, 128, 132, half=True, fp16=True) == before
    bf16 = w4a16.pick_config(1, 4096, 4096, 128, 132, half=True, fp16=False)
    assert not bf16.fold_zero  # bf16 keeps its dispatched path
