"""The baseline of the end-to-end benchmark: Hugging Face transformers ``generate`` in fp16
(fp32 on CPU) on the same shapes, random init, in the same process as the engine's run.

* batch 1 with the static cache (``cache_implementation="static"``; transformers compiles
  the forward itself for that cache unless ``compile`` is False): tokens per second over the
  whole ``generate`` call, after a warm-up call of the same shapes (compilation excluded);
* static batches: the offline workload cut into batches of B requests in order, each padded on
  the left to its longest prompt and run to its longest output (as a static batch does);
  useful output tokens per second, for each B; the best B is the baseline.
"""

from __future__ import annotations

import time
from typing import Any

from .e2e_common import PromptMaker, free_device_memory, log, shape_config, synchronize


def build_hf_model(shape: str, device: str):
    """A transformers model of ``shape`` with random weights, fp16 on CUDA (fp32 on CPU)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = shape_config(shape)
    cfg.pop("architectures")
    model_type = cfg.pop("model_type")
    config = AutoConfig.for_model(model_type, **cfg)
    dtype = torch.float16 if device.startswith("cuda") else torch.float32
    began = time.perf_counter()
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.eval()
    log.info("transformers %s: built in %.1f s", model_type, time.perf_counter() - began)
    return model


def _generate(model, ids, mask, tokens: int, **kwargs):
    import torch

    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=tokens,
                             min_new_tokens=tokens, do_sample=False, pad_token_id=0, **kwargs)
    if out.shape[1] != ids.shape[1] + tokens:
        raise RuntimeError(f"transformers gave {out.shape[1] - ids.shape[1]} new tokens, "
                           f"asked for {tokens}")
    return out


def hf_decode_b1(model, prompts: PromptMaker, prompt_len: int, tokens: int, device: str,
                 compile: bool) -> dict[str, Any]:
    """Batch 1, static cache: tok/s over the whole call (prefill of ``prompt_len`` included)."""
    import torch

    extra: dict[str, Any] = {"cache_implementation": "static"}
    if not compile:
        extra["disable_compile"] = True

    def once() -> float:
        ids = torch.tensor([prompts.ids(prompt_len)], device=device)
        synchronize(device)
        began = time.perf_counter()
        _generate(model, ids, torch.ones_like(ids), tokens, **extra)
        synchronize(device)
        return time.perf_counter() - began

    warm = once()  # compiles (when enabled) for these shapes
    seconds = once()
    log.info("transformers b1 static cache: %.1f tok/s (warm-up call %.1f s)",
             tokens / seconds, warm)
    return {"prompt": prompt_len, "tokens": tokens, "seconds": seconds,
            "tok_s": tokens / seconds, "warmup_s": warm, "compile": compile}


def _padded(batch: list[list[int]], device: str):
    """Left-padded ids and attention mask, (B, longest prompt)."""
    import torch

    width = max(len(p) for p in batch)
    ids = torch.zeros(len(batch), width, dtype=torch.long)
    mask = torch.zeros(len(batch), width, dtype=torch.long)
    for i, p in enumerate(batch):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    return ids.to(device), mask.to(device)


def hf_static_batches(model, work: list[tuple[list[int], int]], batch: int,
                      device: str) -> dict[str, Any]:
    """The workload in static batches of ``batch`` requests (see the module docstring)."""
    ids, mask = _padded([w[0][:16] for w in work[:batch]], device)
    _generate(model, ids, mask, 4)  # warm-up at this batch size
    synchronize(device)
    began = time.perf_counter()
    useful = generated = prompt_tokens = 0
    for lo in range(0, len(work), batch):
        chunk = work[lo:lo + batch]
        ids, mask = _padded([w[0] for w in chunk], device)
        longest = max(n for _, n in chunk)
        _generate(model, ids, mask, longest)
        useful += sum(n for _, n in chunk)
        generated += len(chunk) * longest
        prompt_tokens += sum(len(w[0]) for w in chunk)
    synchronize(device)
    seconds = time.perf_counter() - began
    log.info("transformers static batch %d: %.0f useful output tok/s", batch, useful / seconds)
    return {"batch": batch, "seconds": seconds, "output_tokens": useful,
            "generated_tokens": generated, "output_tok_s": useful / seconds,
            "total_tok_s": (useful + prompt_tokens) / seconds}


def hf_offline(model, work: list[tuple[list[int], int]], batches: tuple[int, ...],
               device: str) -> dict[str, Any]:
    """Every batch size in ``batches`` (out-of-memory ones recorded); the best one."""
    import torch

    runs: dict[str, Any] = {}
    for b in batches:
        try:
            runs[f"b{b}"] = hf_static_batches(model, work, b, device)
        except torch.cuda.OutOfMemoryError as exc:
            runs[f"b{b}"] = {"batch": b, "error": f"out of memory: {str(exc)[:200]}"}
            free_device_memory(device)
    ok = [r for r in runs.values() if "output_tok_s" in r]
    best = max(ok, key=lambda r: r["output_tok_s"]) if ok else None
    return {"runs": runs, "best": best}
