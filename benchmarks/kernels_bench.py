"""How fast are the kernels: the Triton kernels checked and timed on one GPU against fp16
cuBLAS, torch SDPA and the copy bandwidth; one table per section, JSON and log under $OUT.

    python benchmarks/kernels_bench.py --quick      # W4A16 (dispatched) + attention vs cuBLAS/SDPA
    python benchmarks/kernels_bench.py              # ... and the candidate launch configs
    python benchmarks/kernels_bench.py sweep --ms 1,2,16    # every W4A16 candidate per row count
    python benchmarks/kernels_bench.py fused        # fused elementwise kernels vs torch ops
    python benchmarks/kernels_bench.py graphs       # decode with CUDA graphs vs eager
    python benchmarks/kernels_bench.py profile --batches 1,16   # a decode step's kernels
    python benchmarks/kernels_bench.py ceiling      # pure streams and empty kernels, chained
    python benchmarks/kernels_bench.py --smoke; python benchmarks/kernels_bench.py fused --smoke

Every kernel timing is ``lib.kernel_timing.time_op``: the median of triton.testing.do_bench
over replays of a CUDA graph that calls the op on a rotation of input sets (together several
times the L2 size), divided by the calls per replay: no launch gaps, no L2 reuse between
calls; every op is first checked against its reference. ``--smoke`` runs tiny shapes under
TRITON_INTERPRET=1 on the CPU to check the script itself. The parts live in ``lib/``:
w4a16_bench / w4a16_variants (the W4A16 shapes and launch configs), attention_bench,
kernel_report (the summary), w4a16_sweep, fused_bench, decode_graphs, profile_kernels,
chain_ceiling.
"""

from __future__ import annotations

import os
import sys

from edge_llm import envs  # loads neither torch nor triton

if "--smoke" in sys.argv:  # before anything imports triton
    envs.set_default(envs.TRITON_INTERPRET, "1")

import argparse  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
from lib.attention_bench import bench_decode, check_prefill  # noqa: E402
from lib.kernel_report import print_table  # noqa: E402
from lib.kernel_timing import copy_bandwidth  # noqa: E402
from lib.w4a16_bench import MS, bench_w4a16, check_w4a16_bf16  # noqa: E402

SECTIONS = {  # name: (module, what it answers); each takes its own flags (SECTION --help)
    "sweep": ("lib.w4a16_sweep", "every W4A16 launch candidate per shape and row count"),
    "fused": ("lib.fused_bench", "the fused elementwise kernels against the torch ops"),
    "graphs": ("lib.decode_graphs", "decode tok/s with CUDA graphs against eager"),
    "profile": ("lib.profile_kernels", "a decode step's CUDA kernels and host gaps"),
    "ceiling": ("lib.chain_ceiling", "the most a decode step of separate kernels can reach"),
}
SECTIONS_HELP = "sections (kernels_bench.py SECTION --help):\n" + "\n".join(
    f"  {name:8s} {what}" for name, (_, what) in SECTIONS.items())


def kernel_shared_bytes() -> list[dict]:
    """Shared memory of every compiled Triton kernel, from the JIT caches' metadata."""
    import importlib

    res = []
    for path in ("edge_llm.kernels.w4a16", "edge_llm.kernels.paged_attention"):
        mod = importlib.import_module(path)
        for name in dir(mod):
            fn = getattr(mod, name)
            caches = getattr(fn, "device_caches", None)
            if not caches:
                continue
            for cache in caches.values():
                for kern in cache[0].values():
                    res.append(dict(kernel=name, shared=int(kern.metadata.shared),
                                    num_warps=kern.metadata.num_warps))
    return res


def main(argv: list[str] | None = None) -> int:
    """The default section: W4A16 and attention against cuBLAS and SDPA."""
    ap = argparse.ArgumentParser(prog="kernels_bench.py", description=__doc__.splitlines()[0],
                                 epilog=SECTIONS_HELP,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true",
                    help="tiny shapes on the CPU under the Triton interpreter")
    ap.add_argument("--skip-w4", action="store_true")
    ap.add_argument("--quick", action="store_true", help="dispatched configs only, no sweep")
    ap.add_argument("--plot", nargs=2, metavar=("JSON", "PNG"),
                    help="no GPU: draw the W4A16 speed-ups of a saved kernels_bench.json")
    args = ap.parse_args(argv)
    if args.plot:
        from lib.kernel_report import plot_speedup

        with open(args.plot[0]) as f:
            plot_speedup(json.load(f), args.plot[1])
        return 0
    dev = torch.device("cpu" if args.smoke else "cuda")
    out_dir = str(envs.OUT.get() or "/tmp")
    lines: list[str] = []

    def log(s: str) -> None:
        lines.append(s)
        print(s, flush=True)

    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    info = dict(torch=torch.__version__, device=str(dev))
    if dev.type == "cuda":
        import triton

        p = torch.cuda.get_device_properties(dev)
        info.update(name=p.name, sms=p.multi_processor_count, triton=triton.__version__)
    if dev.type == "cuda":  # raise the clocks from idle before the first measurement
        a = torch.randn(8192, 8192, device=dev, dtype=torch.float16)
        t_end = time.time() + 1.5
        while time.time() < t_end:
            a @ a
            torch.cuda.synchronize()
    bw = copy_bandwidth(dev, args.smoke)
    info["copy_GBps"] = bw / 1e9
    log(f"{info}")
    res = dict(info=info)
    res["prefill"] = check_prefill(dev, args.smoke, log)
    res["decode"] = bench_decode(dev, args.smoke, bw, log, args.quick)
    if not args.skip_w4:
        res["w4a16_checks"] = check_w4a16_bf16(dev, args.smoke, log)
        res["w4a16"] = bench_w4a16(dev, args.smoke, log, args.quick)
    if dev.type == "cuda":
        res["shared"] = kernel_shared_bytes()
        info["copy_GBps_end"] = copy_bandwidth(dev, args.smoke) / 1e9
    with open(os.path.join(out_dir, "kernels_bench.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    with open(os.path.join(out_dir, "kernels_bench.log"), "w") as f:
        f.write("\n".join(lines))
    print_table(res, MS)
    return 0


def dispatch(argv: list[str]) -> int:
    """``SECTION [flags]`` runs that section's own command line; anything else is the default
    section's."""
    if argv and argv[0] in SECTIONS:
        return importlib.import_module(SECTIONS[argv[0]][0]).main(argv[1:])
    return main(argv)


if __name__ == "__main__":
    sys.exit(dispatch(sys.argv[1:]))
