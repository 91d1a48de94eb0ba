"""Host (Python) cost of one eager forward on the CUDA code path, measured without a GPU.

    python benchmarks/host_forward.py [--layers 4] [--tokens 1,16,128,512] [--profile 128]

An eager forward of the 7B costs ~45-60 ms on the H200 whatever its length (session 25),
which sets the first token of steps the CUDA graphs do not cover, and the start-up's warm-up
and graph captures (each capture runs the forward's Python twice). Here the GPU is replaced
by stubs, so that what is timed is that Python alone:

- Triton's driver reports an sm_90 target; every kernel is really compiled for it (Triton's
  cache) and its launch is a no-op (the C launcher's few microseconds are not counted);
- ``torch.matmul`` (dequantize + cuBLAS above 64-128 rows) and the lm_head return an empty
  tensor of their shape;
- the model's dispatchers call the Triton wrappers on CPU fp16 tensors, plane-packed words
  as the loader packs them on a GPU (the wrappers take their mma.sync choices on CPU
  tensors, and size split K for 8 multiprocessors).

Left out: CUDA's own launch cost, cuBLAS's heuristics, torch's CUDA op dispatch (an op on a
CPU tensor costs less). A random Llama-2-7B-shaped AWQ checkpoint of ``--layers`` layers
(same per-layer code as 32) is built under --ckpt-dir; the table gives ms per forward and
the figure scaled to 32 layers, and the same forward through the first layer only (the
start-up's warm-up forwards, ``CausalLM.first_layers``); ``--profile T`` prints the top
functions of one T-token forward by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


class StubDriver:
    """Enough of Triton's active driver for JITFunction.run to bind, compile and 'launch'."""

    def __init__(self, arch: int) -> None:
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", arch, 32)

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self):
        return self.target


def install_stubs(arch: int = 90) -> None:
    """Triton launches as no-ops after a real compile for ``arch``; torch.matmul an empty
    result; the model's kernels through the Triton wrappers (CPU tensors)."""
    import torch
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction

    driver.set_active(StubDriver(arch))
    compile_ = JITFunction._do_compile

    def do_compile(self, *args, **kwargs):
        kernel = compile_(self, *args, **kwargs)
        kernel._run = lambda *a: None  # the launch: nothing
        kernel.module, kernel.function = "stub", 0  # no module to load (_init_handles)
        return kernel

    JITFunction._do_compile = do_compile
    torch.matmul = lambda a, b: a.new_empty(a.shape[0], b.shape[1])

    import importlib

    import edge_llm.model.layers as layers
    import edge_llm.model.llama as llama
    from edge_llm.quant import QuantLinear

    # the modules, not the dispatchers of the same names in edge_llm.kernels
    fused, paged_attention, rotary_kv, w4a16 = (importlib.import_module(f"edge_llm.kernels.{m}")
                                                for m in ("fused", "paged_attention",
                                                          "rotary_kv", "w4a16"))

    layers.rms_norm, layers.add_rms_norm = fused.rms_norm, fused.add_rms_norm
    llama.silu_and_mul = fused.silu_and_mul
    llama.rotary_write_kv = rotary_kv.rotary_write_kv
    llama.paged_attention = paged_attention.paged_attention_triton
    QuantLinear.forward = lambda self, x: self._forward_kernel(w4a16.w4a16_matmul, x)


def build_model(layers: int, ckpt_dir: Path):
    import random_checkpoint as rc
    import torch

    from edge_llm.model.loader import load_model
    from edge_llm.quant import QuantLinear

    shape = f"llama2-7b-{layers}l"
    rc.SHAPES[shape] = {**rc.SHAPES["llama2-7b"], "num_hidden_layers": layers}
    path = ckpt_dir / shape
    if not (path / "config.json").is_file():
        rc.make_random_checkpoint(shape, "awq", path, 128, "cpu")
    loaded = load_model(str(path), dtype="float16", device="cpu", progress=False)
    model = loaded.model
    for m in model.modules():  # what the loader does on a GPU (edge_llm/model/plane_pack.py)
        if isinstance(m, QuantLinear) and m.planes_packable():
            m.pack_planes()
    vocab = loaded.arch.vocab_size
    model.lm_head.forward = lambda h: h.new_empty(h.shape[0], vocab)
    return model, torch.float16


def forward_seconds(model, tokens: int, runs: int, dtype, first_layer: bool = False) -> float:
    """Median host seconds of one forward; ``first_layer``: under ``first_layers(1)``, as
    the start-up's warm-up forwards run."""
    import contextlib

    import torch

    from edge_llm.model.full_forward import scratch_prefill

    kv, meta = scratch_prefill(model, tokens, 16, dtype, torch.device("cpu"))
    ids = torch.zeros(tokens, dtype=torch.int64)
    pos = torch.arange(tokens)
    times = []
    with torch.inference_mode():
        for _ in range(runs + 1):  # the first compiles (or loads) the kernels
            t0 = time.perf_counter()
            with model.first_layers(1) if first_layer else contextlib.nullcontext():
                hidden = model(ids, pos, kv, meta)
            model.compute_logits(hidden[-1:])
            times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--tokens", default="1,16,128,512")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--profile", type=int, default=0, help="profile one forward of T tokens")
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--ckpt-dir", type=Path, default=Path("/tmp/edge-llm-host-forward"))
    args = ap.parse_args()
    install_stubs(args.arch)
    model, dtype = build_model(args.layers, args.ckpt_dir)
    print(f"| new tokens | ms per forward ({args.layers} layers) | ms per layer | "
          f"scaled to 32 layers, ms | first layer only (start-up warm-ups), ms |")
    print("| --- | --- | --- | --- | --- |")
    for t in (int(x) for x in args.tokens.split(",")):
        s = forward_seconds(model, t, args.runs, dtype)
        one = forward_seconds(model, t, args.runs, dtype, first_layer=True)
        print(f"| {t} | {s * 1e3:.2f} | {s * 1e3 / args.layers:.3f} | "
              f"{s * 1e3 * 32 / args.layers:.1f} | {one * 1e3:.2f} |")
    if args.profile:
        import torch

        from edge_llm.model.full_forward import scratch_prefill

        kv, meta = scratch_prefill(model, args.profile, 16, dtype, torch.device("cpu"))
        ids, pos = torch.zeros(args.profile, dtype=torch.int64), torch.arange(args.profile)
        prof = cProfile.Profile()
        with torch.inference_mode():
            model(ids, pos, kv, meta)
            prof.enable()
            for _ in range(5):
                model(ids, pos, kv, meta)
            prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).strip_dirs().sort_stats("tottime").print_stats(30)
        print(f"\n5 forwards of {args.profile} tokens, {args.layers} layers, by own time:")
        print(buf.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
