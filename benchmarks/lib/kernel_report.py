"""The printed summary of benchmarks/kernels_bench.py: one table per kernel family, from its
results.

``print_table(res, ms)`` reads the dict that kernels_bench.py writes as kernels_bench.json (keys
"w4a16", "w4a16_checks", "decode", "prefill", "shared"; any may be missing) and prints the
W4A16 speed-ups over fp16 cuBLAS with one column per activation row count in ``ms`` ("-" where
not measured), the worst W4A16 check error, the paged decode and prefill rows and the largest
shared-memory use of the compiled kernels. ``plot_speedup(res, png)`` draws the dispatched
W4A16 speed-up against activation rows, one line per shape (``draw_speedup``, which
the sweep's plot shares). None of them measures anything.
"""

from __future__ import annotations


def print_table(res: dict, ms: list[int]) -> None:
    print("\n==== W4A16 speed-up vs fp16 cuBLAS (auto = dispatched path; best = best variant)")
    print(f"{'shape':22s} " + " ".join(f"{m:>9d}" for m in ms))
    by = {}
    for r in res.get("w4a16", []):
        by.setdefault(f"{r['model']}:{r['shape']} {r['k']}x{r['n']}", {})[r["m"]] = r
    for key, per_m in by.items():
        auto = " ".join(f"{per_m[m]['auto_res']['speedup']:>9.2f}" if m in per_m and
                        "auto_res" in per_m[m] else f"{'-':>9s}" for m in ms)
        best = " ".join(f"{per_m[m]['best']['speedup']:>9.2f}" if m in per_m and
                        per_m[m].get("best") else f"{'-':>9s}" for m in ms)
        print(f"{key[:22]:22s} {auto}   auto\n{'':22s} {best}   best")
    worst = max((c["err"] for c in res.get("w4a16_checks", [])), default=float("nan"))
    print(f"W4A16 dispatched-path max rel err over fp16/bf16 checks: {worst:.2e}")
    print("\n==== paged decode (default config | best variant)")
    for r in res.get("decode", []):
        d, b = r.get("default") or {}, r.get("best") or {}
        print(f"B={r['b']:3d} ctx={r['ctx']:5d}/{r.get('max_ctx', r['ctx']):5d} H={r['h']} "
              f"Hkv={r['hkv']}: sdpa {r['sdpa_us']:.1f}us | default {d.get('us', 0):.1f}us bw "
              f"{d.get('bw_frac', 0):.2f} x{d.get('vs_sdpa', 0):.2f} sdpa err "
              f"{d.get('err', 0):.1e} | best {b.get('us', 0):.1f}us bw {b.get('bw_frac', 0):.2f} "
              f"x{b.get('vs_sdpa', 0):.2f} {b.get('cfg')}")
    for p in res.get("prefill", []):
        print(f"prefill {p['dtype']} nq={p['nq']} ctx={p['ctx']} H={p['h']}/{p['hkv']} "
              f"err {p['err']:.1e}" + (f" {p['us']:.0f}us {p['tflops']:.0f} TFLOP/s"
                                       if "us" in p else ""))
    sh = res.get("shared", [])
    if sh:
        print(f"shared memory: max {max(s['shared'] for s in sh)} B over {len(sh)} compiled "
              f"kernels (limit 101376 on sm_86/89)")


def plot_speedup(res: dict, png) -> None:
    """The dispatched ("auto") W4A16 speed-up over fp16 cuBLAS against activation rows, one
    line per shape, with the issue's targets; ``res`` as kernels_bench.json holds it."""
    lines: dict[str, list[tuple[int, float]]] = {}
    for r in res.get("w4a16", []):
        if "auto_res" in r:
            lines.setdefault(f"{r['model']} {r['shape']}", []).append(
                (r["m"], r["auto_res"]["speedup"]))
    info = res.get("info", {})
    draw_speedup(lines, f"W4A16 g128, dispatched path, {info.get('name', 'GPU')} "
                 f"(copy {info.get('copy_GBps', 0) / 1e3:.2f} TB/s)", png)


def draw_speedup(lines: dict[str, list[tuple[int, float]]], title: str, png) -> None:
    """One line per name of (rows, speed-up over cuBLAS) points, log2 rows, the 1x line and
    the 3.5x target; written to ``png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, pts in lines.items():
        pts = sorted(pts)
        ax.plot([m for m, _ in pts], [v for _, v in pts], marker="o", label=name)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axhline(3.5, color="red", lw=0.8, ls="--", label="target at 1-16 rows")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("activation rows (tokens)")
    ax.set_ylabel("speed-up over fp16 cuBLAS")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
