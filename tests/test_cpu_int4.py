"""The CPU's 4-bit path (quant/cpu_int4.py): bf16 activations through torch's int4 kernel give
the runtime layout's product within bf16 rounding, in every format, and faster than
dequantizing the weight at each call; threads follow the CPUs available."""

from __future__ import annotations

import statistics
import time

import pytest
import torch

from edge_llm.engine.cpu_threads import available_cpus, set_cpu_threads
from edge_llm.model.loader import load_model
from edge_llm.quant import QuantLinear, QuantSpec, cpu_dense, dequantize_runtime
from tests.helpers import rel_err, tiny_hf_model
from tests.test_model_parity import run_prefill_then_decode
from tests.test_model_quant_parity import CASES, _quantized_checkpoint
from tests.test_quant_formats import FORMAT_CASES, _act_order_g_idx, _pack, _rand_weight

BF16_REL = 1e-2  # bf16 inputs and outputs: about 2**-8 relative each, summed over K


def _linear(fields: dict, k: int, n: int, gen, bias: bool = False) -> tuple[QuantLinear, object]:
    spec = QuantSpec(**fields)
    gs = spec.group_size_for(k)
    g_idx = _act_order_g_idx(k, gs, gen) if fields.get("desc_act") else None
    w = _rand_weight(k, n, gs, gen, g_idx, sym=spec.sym)
    tensors = _pack(spec, w)
    if bias:
        tensors["bias"] = torch.randn(n, generator=gen)
    lin = QuantLinear(k, n, bias, spec, torch.bfloat16)
    lin.load_checkpoint_tensors(tensors, "cpu")
    return lin, w


@pytest.mark.parametrize("kind,fields", FORMAT_CASES)
def test_bf16_input_matches_the_fp32_reference(kind, fields):
    gen = torch.Generator().manual_seed(5)
    k, n = 256, 48
    lin, w = _linear(fields, k, n, gen, bias=kind == "awq")
    x = torch.randn(3, 5, k, generator=gen)
    ref = x @ w.dequantize() + (lin.bias.float() if lin.bias is not None else 0)
    y = lin(x.bfloat16())
    assert y.dtype == torch.bfloat16 and y.shape == (3, 5, n)
    assert rel_err(y.float(), ref) < BF16_REL
    # per-channel groups (group size = K = 256) are among the kernel's sizes too
    assert lin._cpu_int4_weight() is not None
    assert lin._cpu_weight is None  # no dense copy was made


@pytest.mark.parametrize("kind,fields", [FORMAT_CASES[0], FORMAT_CASES[6]])  # bias; act order
def test_many_rows_run_on_the_dense_copy_within_its_budget(kind, fields, monkeypatch):
    gen = torch.Generator().manual_seed(11)
    k, n = 256, 48
    lin, w = _linear(fields, k, n, gen, bias=kind == "awq")
    x = torch.randn(2, cpu_dense.DENSE_MIN_ROWS, k, generator=gen)
    ref = x @ w.dequantize() + (lin.bias.float() if lin.bias is not None else 0)
    budget = cpu_dense.DenseBudget()
    monkeypatch.setattr(cpu_dense, "BUDGET", budget)
    y = lin(x.bfloat16())
    assert lin._cpu_dense is not None and lin._cpu_dense.dtype == torch.bfloat16
    assert budget.used == 2 * k * n
    assert rel_err(y.float(), ref) < BF16_REL
    one = lin(x[:1, :1].bfloat16())  # a decode row: the int4 kernel, the same function
    assert rel_err(one.float(), ref[:1, :1]) < BF16_REL
    lin.drop_cpu_cache()  # the copy freed: its share back
    assert budget.used == 0
    budget.limit = 2 * k * n - 1  # no room: every step on the int4 kernel
    y = lin(x.bfloat16())
    assert lin._cpu_dense is None and rel_err(y.float(), ref) < BF16_REL


def test_permuted_input_and_unsupported_shapes_fall_back():
    gen = torch.Generator().manual_seed(7)
    act = dict(method="gptq", group_size=32, sym=False, desc_act=True)
    lin, w = _linear(act, 128, 32, gen)
    x = torch.randn(4, 128, generator=gen)
    lin.take_permuted_input()  # the caller now delivers x[..., perm]
    y = lin(x.index_select(-1, lin.perm).bfloat16())
    assert rel_err(y.float(), x @ w.dequantize()) < BF16_REL
    for fields, k, n in ((dict(method="awq", group_size=32), 64, 24),  # N not a multiple of 16
                         (dict(method="gptq", group_size=-1), 512, 16)):  # group 512
        lin, w = _linear(fields, k, n, gen)
        y = lin(torch.randn(2, k, generator=gen).bfloat16())
        assert lin._cpu_int4_weight() is None and lin._cpu_weight is not None
        assert y.dtype == torch.bfloat16


def test_cache_follows_the_tensors():
    gen = torch.Generator().manual_seed(8)
    fields = dict(method="awq", group_size=32)
    lin, a = _linear(fields, 64, 32, gen)
    x = torch.randn(2, 64, generator=gen)
    assert rel_err(lin(x.bfloat16()).float(), x @ a.dequantize()) < BF16_REL
    b = _rand_weight(64, 32, 32, gen)
    lin.load_checkpoint_tensors(_pack(QuantSpec(**fields), b), "cpu")
    assert rel_err(lin(x.bfloat16()).float(), x @ b.dequantize()) < BF16_REL
    cols = torch.randperm(32, generator=gen)
    lin.permute_outputs(cols)
    assert rel_err(lin(x.bfloat16()).float(), (x @ b.dequantize())[:, cols]) < BF16_REL


def _median_seconds(fn, runs: int = 9) -> float:
    fn()
    times = []
    for _ in range(runs):
        start = time.process_time()  # CPU time: steadier than wall time on a shared machine
        fn()
        times.append(time.process_time() - start)
    return statistics.median(times)


def test_decode_row_is_faster_than_dequantizing_each_call():
    """One row through the demo's widest linear (576 -> 3072, group 32): the packed kernel
    against what a CPU path without a cached form pays, a dequantization per call (measured
    ~30x apart; the floor is 3x for a loaded 2-core machine)."""
    gen = torch.Generator().manual_seed(9)
    lin, _ = _linear(dict(method="awq", group_size=32), 576, 3072, gen)
    x = torch.randn(1, 576, generator=gen).bfloat16()

    def per_call() -> torch.Tensor:
        w = dequantize_runtime(lin.qweight, lin.scales, lin.zeros, lin.group_size)
        return (x.float() @ w).bfloat16()

    with torch.no_grad():
        packed = _median_seconds(lambda: lin(x))
        dequant = _median_seconds(per_call)
    assert packed * 3 < dequant, (packed, dequant)


def test_auto_dtype_runs_4bit_checkpoints_on_the_int4_kernel(tmp_path):
    """dtype "auto" on the CPU gives a 4-bit checkpoint bf16 and every linear the packed
    kernel, and its logits stay near the fp32 reference's; "float32" keeps that reference.
    bf16 activations round every layer's inputs to 8 bits of mantissa: the logits' relative
    error was 0.020 with the prompt step on the dense bf16 copy and 0.030 on the int4 kernel
    (which one runs depends on the memory free for dense copies), so the bound is 5e-2; a
    wrong kernel gives errors of order 1."""
    hf = tiny_hf_model("LlamaForCausalLM")
    path = _quantized_checkpoint(hf, CASES[0], tmp_path / "awq")  # AWQ group 32
    fast = load_model(str(path), device="cpu", progress=False)
    ref = load_model(str(path), device="cpu", dtype="float32", progress=False)
    assert (fast.dtype, ref.dtype) == (torch.bfloat16, torch.float32)
    ids = torch.randint(0, 160, (24,), generator=torch.Generator().manual_seed(3))
    logits = run_prefill_then_decode(fast.model, ids)
    assert rel_err(logits, run_prefill_then_decode(ref.model, ids)) < 5e-2
    linears = [m for m in fast.model.modules() if isinstance(m, QuantLinear)]
    assert linears and all(lin._cpu_int4_weight() is not None for lin in linears)


def test_threads_capped_at_the_cpus_available(tmp_path, monkeypatch):
    quota = tmp_path / "cpu.max"
    quota.write_text("150000 100000\n")
    assert available_cpus(quota) == 1  # whole CPUs of a 1.5-CPU quota
    quota.write_text("max 100000\n")
    assert available_cpus(quota) == available_cpus(tmp_path / "absent")
    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        torch.set_num_threads(available_cpus() + 3)
        assert set_cpu_threads() == available_cpus() == torch.get_num_threads()
        monkeypatch.setenv("OMP_NUM_THREADS", str(available_cpus() + 3))
        torch.set_num_threads(available_cpus() + 3)
        assert set_cpu_threads() == available_cpus() + 3  # the user's setting wins
    finally:
        torch.set_num_threads(before)
