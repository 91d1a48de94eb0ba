"""Quantize a transformers Llama-family causal LM into an AWQ or GPTQ checkpoint state dict.

Works on ``LlamaForCausalLM``, ``Qwen2``/``Qwen3``/``Mistral``/``Gemma2``/``Gemma3``
(``model.model.layers[i]`` with ``self_attn.{q,k,v,o}_proj`` and ``mlp.{gate,up,down}_proj``) and
``Phi3`` (``self_attn.qkv_proj``, ``mlp.gate_up_proj``). Every ``nn.Linear`` inside a decoder
layer is quantized; embeddings, norms and ``lm_head`` stay floating point (fp16 in the output).

Side effect, on purpose: each quantized linear's ``weight`` is overwritten in place with its
dequantized value, so the same model object measures the checkpoint's quality (perplexity) and
later layers of the GPTQ pass see the quantized outputs of earlier ones.

GPTQ pass (AutoGPTQ's order)::

    calibration ids -> model (stopped at layer 0) -> inputs[0], layer kwargs
    for each layer:  for each group of linears (true sequential: qkv | o | gate,up | down):
                         run the layer, hooks accumulate H of the group's inputs, quantize
                     run the layer once more -> inputs of the next layer
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from torch import nn

from .awq import pack_awq
from .calibration import calibration_windows, load_calibration_texts
from .gptq import pack_gptq
from .gptq_method import HessianAccumulator, gptq_quantize
from .packing import PACK, QuantizedWeight
from .rtn import fake_quantize, rtn_quantize

logger = logging.getLogger(__name__)
# AutoGPTQ's true-sequential order; linears not named here form one last group
SEQUENTIAL_GROUPS = (
    ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.qkv_proj"),
    ("self_attn.o_proj",),
    ("mlp.gate_proj", "mlp.up_proj", "mlp.gate_up_proj"),  # Phi-3: merged in the model
    ("mlp.down_proj",),
)
Result = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # q, scales, zeros, g_idx


class _StopForward(Exception):
    """Raised from a hook to end a forward pass early once the wanted inputs are captured."""


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        raise ValueError("quantize_model needs decoder layers at model.model.layers")
    return layers


def layer_linears(layer: nn.Module) -> dict[str, nn.Linear]:
    return {n: m for n, m in layer.named_modules() if isinstance(m, nn.Linear)}


def _check_options(model, fmt, method, group_size, desc_act, static_groups) -> None:
    if fmt not in ("awq", "gptq"):
        raise ValueError(f"fmt must be 'awq' or 'gptq', got {fmt!r}.")
    if method not in ("rtn", "gptq", "awq"):
        raise ValueError(f"method must be 'rtn', 'gptq' or 'awq', got {method!r}.")
    if group_size != -1 and group_size < 1:
        raise ValueError(f"group_size must be -1 or >= 1, got {group_size}.")
    if fmt == "awq" and ((desc_act and not static_groups) or group_size == -1):
        raise ValueError("fmt='awq' needs sequential groups (desc_act=False, or desc_act with "
                         "static_groups) and group_size > 0.")
    if desc_act and method != "gptq":
        raise ValueError("desc_act (act-order) needs method='gptq'.")
    for i, layer in enumerate(decoder_layers(model)):
        for name, lin in layer_linears(layer).items():
            k, n = lin.in_features, lin.out_features
            if k % PACK or n % PACK or (fmt == "awq" and k % group_size):
                raise ValueError(
                    f"model.layers.{i}.{name} ({k} -> {n}) cannot be packed: in/out features "
                    f"must be multiples of {PACK} (and of group_size {group_size} for AWQ)."
                )


@torch.no_grad()
def quantize_model(
    model: nn.Module,
    tokenizer,
    *,
    fmt: str = "awq",
    method: str = "gptq",
    group_size: int = 128,
    sym: bool = False,
    desc_act: bool = False,
    calib_texts: list[str] | None = None,
    nsamples: int = 128,
    seqlen: int = 512,
    checkpoint_format: str = "gptq",
    damp: float = 0.01,
    true_sequential: bool = True,
    static_groups: bool = False,
    mse: bool = False,
    batch_size: int = 8,
) -> dict[str, torch.Tensor]:
    """Quantize every decoder-layer linear of ``model`` and return the full checkpoint state dict.

    ``fmt``: tensors written ("awq" GEMM or "gptq" with ``checkpoint_format`` v1/v2).
    ``method``: "rtn" (no calibration), "gptq" (Hessian method), "awq" (AutoAWQ scale/clip search,
    then round-to-nearest; needs ``autoawq``). ``calib_texts`` defaults to the bundled
    calibration prose. ``desc_act`` processes columns in act-order; with ``static_groups`` the
    groups stay sequential (so fmt="awq" can store it). ``mse`` searches each group's clipping
    range. Pair the result with ``quantization_config_for`` and ``save_quantized``.
    """
    _check_options(model, fmt, method, group_size, desc_act, static_groups)
    model.eval()
    layers = decoder_layers(model)
    start = time.perf_counter()
    if method == "rtn":
        results = _rtn_all(layers, group_size, sym, mse)
    else:
        texts = calib_texts if calib_texts is not None else load_calibration_texts()
        windows = calibration_windows(tokenizer, texts, nsamples, seqlen)
        if method == "gptq":
            opts = dict(group_size=group_size, sym=sym, act_order=desc_act, damp=damp,
                        static_groups=static_groups, mse=mse)
            results = _gptq_all(model, layers, windows, opts, true_sequential, batch_size)
        else:
            from .awq_method import awq_scale_and_clip

            awq_scale_and_clip(model, tokenizer, windows, group_size, sym)
            results = _rtn_all(layers, group_size, sym, mse)
    logger.info("Quantized %d layers (%s) in %.1f s", len(layers), method,
                time.perf_counter() - start)
    return _checkpoint_state_dict(model, results, fmt, checkpoint_format, group_size)


def _apply(linear: nn.Linear, result: Result) -> None:
    q, scales, zeros, g_idx = result
    linear.weight.data.copy_(fake_quantize(q, scales, zeros, g_idx).to(linear.weight.dtype))


def _rtn_all(layers: nn.ModuleList, group_size: int, sym: bool, mse: bool) -> dict[str, Result]:
    results = {}
    for i, layer in enumerate(layers):
        for name, lin in layer_linears(layer).items():
            q, scales, zeros = rtn_quantize(lin.weight.data, 4, group_size, sym, mse)
            gs = lin.in_features if group_size == -1 else group_size
            g_idx = torch.div(torch.arange(lin.in_features, device=q.device), gs,
                              rounding_mode="floor")
            results[f"model.layers.{i}.{name}"] = (q, scales, zeros, g_idx.to(torch.int32))
            _apply(lin, results[f"model.layers.{i}.{name}"])
    return results


def _capture_layer0(model, layer0, windows, batch_size):
    """Inputs of decoder layer 0 per calibration batch: list of (args, kwargs)."""
    captured: list[tuple[tuple, dict[str, Any]]] = []

    def hook(_module, args, kwargs):
        kwargs = dict(kwargs)
        if not args:  # hidden states passed by keyword
            args = (kwargs.pop("hidden_states"),)
        captured.append((tuple(args), kwargs))
        raise _StopForward

    handle = layer0.register_forward_pre_hook(hook, with_kwargs=True)
    device = next(model.parameters()).device
    try:
        for batch in windows.split(batch_size):
            try:
                model(input_ids=batch.to(device), use_cache=False)
            except _StopForward:
                pass
    finally:
        handle.remove()
    if len(captured) != len(windows.split(batch_size)):
        raise RuntimeError("Could not capture the inputs of decoder layer 0.")
    return captured


def _run_layer(layer, args, kwargs) -> torch.Tensor:
    out = layer(*args, **kwargs)
    return out[0] if isinstance(out, tuple) else out


def _groups(linears: dict[str, nn.Linear], true_sequential: bool) -> list[list[str]]:
    if not true_sequential:
        return [list(linears)]
    groups = [[n for n in g if n in linears] for g in SEQUENTIAL_GROUPS]
    named = {n for g in groups for n in g}
    rest = [n for n in linears if n not in named]
    return [g for g in groups if g] + ([rest] if rest else [])


def _collect_hessians(layer, linears, group, batches) -> dict[str, HessianAccumulator]:
    """Run the layer over every batch until the group's linears have all seen their inputs."""
    accs = {n: HessianAccumulator(linears[n].in_features) for n in group}
    seen: set[str] = set()

    def make_hook(name):
        def hook(_module, inputs, _output):
            accs[name].add(inputs[0])
            seen.add(name)
            if len(seen) == len(group):
                raise _StopForward

        return hook

    handles = [linears[n].register_forward_hook(make_hook(n)) for n in group]
    try:
        for args, kwargs in batches:
            seen.clear()
            try:
                _run_layer(layer, args, kwargs)
            except _StopForward:
                pass
    finally:
        for h in handles:
            h.remove()
    return accs


def _gptq_all(model, layers, windows, opts, true_sequential, batch_size) -> dict[str, Result]:
    batches = _capture_layer0(model, layers[0], windows, batch_size)
    results = {}
    began = time.perf_counter()
    for i, layer in enumerate(layers):
        tick = time.perf_counter()
        linears = layer_linears(layer)
        for group in _groups(linears, true_sequential):
            accs = _collect_hessians(layer, linears, group, batches)
            for name in group:
                lin = linears[name]
                res = gptq_quantize(lin.weight.data, accs[name].hessian(), bits=4, **opts)
                results[f"model.layers.{i}.{name}"] = res
                _apply(lin, res)
        batches = [((_run_layer(layer, args, kwargs), *args[1:]), kwargs)
                   for args, kwargs in batches]
        now = time.perf_counter()
        left = (now - began) / (i + 1) * (len(layers) - i - 1)  # layers are alike in cost
        logger.info("GPTQ layer %d/%d: %.1f s (about %.0f s left)", i + 1, len(layers),
                    now - tick, left)
    return results


def _checkpoint_state_dict(
    model, results: dict[str, Result], fmt: str, checkpoint_format: str, group_size: int
) -> dict[str, torch.Tensor]:
    tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    state: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        if tied and name == "lm_head.weight":
            continue  # tied to model.embed_tokens.weight; loaders re-tie it
        module, _, leaf = name.rpartition(".")
        if module in results and leaf == "weight":
            q, scales, zeros, g_idx = results[module]
            gs = q.shape[1] if group_size == -1 else group_size
            w = QuantizedWeight.from_rows(q, scales, zeros, gs, g_idx)
            packed = pack_awq(w) if fmt == "awq" else pack_gptq(w, checkpoint_format)
            state.update({f"{module}.{k}": v for k, v in packed.items()})
        elif tensor.is_floating_point():
            state[name] = tensor.detach().to(torch.float16).contiguous().clone()
        else:
            state[name] = tensor.detach().contiguous().clone()
    return state
