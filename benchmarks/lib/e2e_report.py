"""The end-to-end benchmark's headline table (ratios against targets) and its PNG plots.

Every row is a ratio or a fraction with its target; bare times stay in the JSON.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .e2e_common import log

Row = tuple[str, str, float | None, str, bool | None]  # shape, measure, value, target, ok


def _get(d: dict, *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def headline_rows(results: dict[str, Any]) -> list[Row]:
    """One row per headline measure that ran, per shape (missing measures are left out)."""
    rows: list[Row] = []
    for shape, r in results["shapes"].items():
        def add(measure: str, value: float | None, target: str, ok: bool | None,
                shape: str = shape) -> None:
            if value is not None:
                rows.append((shape, measure, value, target, ok))

        for key, d in (_get(r, "decode") or {}).items():
            frac = d["bandwidth_fraction"]
            add(f"decode {key}: fraction of bandwidth floor", frac,
                ">= 0.50" if key == "b1" else "reported", frac >= 0.5 if key == "b1" else None)
        vs_hf = _ratio(_get(r, "decode", "b1", "e2e_tok_s"), _get(r, "baseline", "b1", "tok_s"))
        add("decode b1 tok/s vs transformers b1 static cache", vs_hf, "> 1", _gt(vs_hf, 1))
        off = _ratio(_get(r, "offline", "output_tok_s"),
                     _get(r, "baseline", "offline", "best", "output_tok_s"))
        add("offline output tok/s vs transformers best static batch", off, ">= 10",
            _gt(off, 10, eq=True))
        add("offline: fraction of the sequential floor (KV reads + matmuls)",
            _get(r, "offline", "floor_fraction"), "reported", None)
        add("offline: the sequential floor's tok/s vs transformers best static batch",
            _ratio(_get(r, "offline", "floor", "sequential_tok_s"),
                   _get(r, "baseline", "offline", "best", "output_tok_s")), "reported", None)
        seqs = _get(r, "gen64", "seqs")
        gen = _get(r, "gen64", "vs_llama_cpp_gen")
        add(f"{seqs} seqs generation tok/s vs llama.cpp 64 seqs (3,861)", gen, "> 1",
            _gt(gen, 1))
        pre = _get(r, "gen64", "vs_llama_cpp_prefill")
        add(f"{seqs} seqs prefill tok/s vs llama.cpp 64 seqs (12,200)", pre, "reported", None)
        pc = _get(r, "prefix", "ttft_ratio_off_on")
        add("prefix caching: TTFT off / on", pc, ">= 5", _gt(pc, 5, eq=True))
        card = _get(r, "card24") or {}
        if card:
            gb = f"{card['card_bytes'] / 1e9:.3g} GB card"
            add(f"{gb}: {card['seq_len']}-token sequences that fit", card["seqs_fit"],
                "reported", None)
            add(f"{gb}: (weights + KV) / card", card["weights_plus_kv_bytes"]
                / card["card_bytes"], "<= 1", card["weights_plus_kv_ok"])
            if card.get("peak_reserved_bytes") is not None:
                add(f"{gb}: (peak reserved + context) / card",
                    (card["peak_reserved_bytes"] + card["context_bytes"]) / card["card_bytes"],
                    "<= 1", card["peak_plus_context_ok"])
                add(f"{gb}: CUDA graphs held / set aside", card["graph_bytes"]
                    / max(card["graph_estimate_bytes"], 1), "<= 1",
                    card["graph_bytes"] <= card["graph_estimate_bytes"])
        for name, limit in (("gptq", 0.05), ("gptq-act", 0.10)):
            ratio = _get(r, "formats", f"{name}_vs_awq")
            add(f"decode b1 {name} / awq", ratio, f"within {limit:.0%}",
                None if ratio is None else abs(ratio - 1) <= limit)
        levels = _get(r, "serving", "levels") or {}
        if levels:
            low, high = levels[min(levels, key=int)], levels[max(levels, key=int)]
            add(f"serving c={high['concurrency']} / c={low['concurrency']} output tok/s",
                _ratio(high["output_tok_s"], low["output_tok_s"]), "reported", None)
            add(f"serving c={high['concurrency']}: ITL p99 / p50",
                _ratio(high["itl_ms"]["p99"], high["itl_ms"]["p50"]), "reported", None)
        rows.extend(_long_rows(shape, _get(r, "long")))
    return rows


LONG_PREFILL_TARGET = (16384, 0.6)  # issue 37: prefill >= 0.6 of the fp16 matmul rate at 16k


def _long_rows(shape: str, long: dict[str, Any] | None) -> list[Row]:
    """Per KV dtype and context: prefill fraction of the matmul rate, TTFT whole / cached,
    decode fraction of the floor with KV reads."""
    rows: list[Row] = []
    for kv, by_context in ((long or {}).get("kv") or {}).items():
        name = "fp16" if kv == "auto" else kv
        for key, c in by_context.items():
            if not key.startswith("c"):
                continue
            n = c["context"]
            label = f"long {n // 1024}k" if n >= 1024 else f"long {n}"
            target = n == LONG_PREFILL_TARGET[0]
            frac = c["prefill_fraction"]
            rows.append((shape, f"{label} {name} KV: prefill fraction of fp16 matmul rate", frac,
                         f">= {LONG_PREFILL_TARGET[1]}" if target else "reported",
                         frac >= LONG_PREFILL_TARGET[1] if target else None))
            rows.append((shape, f"{label} {name} KV: TTFT whole / prefix cached",
                         c["ttft_whole_over_cached"], "reported", None))
            rows.append((shape, f"{label} {name} KV: decode b1 fraction of floor (weights + KV)",
                         c["decode_floor_fraction"], "reported", None))
    return rows


def _gt(value: float | None, limit: float, eq: bool = False) -> bool | None:
    if value is None:
        return None
    return value >= limit if eq else value > limit


def format_table(rows: list[Row]) -> str:
    head = ("shape", "measure", "value", "target", "ok")
    cells = [(s, m, f"{v:,.3g}" if isinstance(v, float) else str(v), t,
              "-" if ok is None else ("yes" if ok else "NO")) for s, m, v, t, ok in rows]
    widths = [max(len(str(c[i])) for c in [head, *cells]) for i in range(5)]
    line = lambda c: " | ".join(str(x).ljust(w) for x, w in zip(c, widths, strict=True))
    return "\n".join([line(head), "-+-".join("-" * w for w in widths), *map(line, cells)])


def draw_plots(results: dict[str, Any], out_dir: Path) -> list[str] | str:
    """throughput_vs_concurrency.png and latency_percentiles.png; a reason string if none."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "plots skipped: matplotlib is not installed"
    files = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    drawn = False
    for shape, r in results["shapes"].items():
        dec = _get(r, "decode") or {}
        if dec:
            xs = [d["batch"] for d in dec.values()]
            ax.plot(xs, [d["decode_tok_s"] for d in dec.values()], "o-",
                    label=f"{shape} engine decode (in process)")
            drawn = True
        lv = _get(r, "serving", "levels") or {}
        if lv:
            xs = [v["concurrency"] for v in lv.values()]
            ax.plot(xs, [v["output_tok_s"] for v in lv.values()], "s-",
                    label=f"{shape} HTTP server, streamed")
            drawn = True
        hf = _get(r, "baseline", "offline", "runs") or {}
        pts = [(v["batch"], v["output_tok_s"]) for v in hf.values() if "output_tok_s" in v]
        b1 = _get(r, "baseline", "b1", "tok_s")
        if b1 is not None:
            pts = [(1, b1), *pts]
        if pts:
            ax.plot(*zip(*sorted(pts), strict=True), "x--", label=f"{shape} transformers fp16")
            drawn = True
    if drawn:
        ax.set(xscale="log", yscale="log", xlabel="concurrent sequences",
               ylabel="output tokens / s", title="Throughput vs concurrency")
        ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
        path = out_dir / "throughput_vs_concurrency.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        files.append(path.name)
    plt.close(fig)
    for shape, r in results["shapes"].items():
        lv = _get(r, "serving", "levels") or {}
        if not lv or len(files) >= 2:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.5))
        xs = [v["concurrency"] for v in lv.values()]
        for metric, style in (("ttft_ms", "o"), ("itl_ms", "s")):
            for q, line in (("p50", "-"), ("p99", "--")):
                ax.plot(xs, [v[metric][q] for v in lv.values()], style + line,
                        label=f"{metric.split('_')[0].upper()} {q}")
        ax.set(xscale="log", yscale="log", xlabel="concurrency", ylabel="milliseconds",
               title=f"Latency percentiles through the server ({shape})")
        ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
        path = out_dir / "latency_percentiles.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        files.append(path.name)
    log.info("plots: %s", files)
    return files
