"""Build a decoder from a checkpoint folder or hub id and load its weights once, in place.

The model is built on the meta device, then each checkpoint tensor is moved once to its final
device and dtype (quantized linears convert their format tensors to the runtime layout).
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from .arch import (
    ArchConfig,
    InvalidConfigError,
    checkpoint_tensor_name,
    parse_arch_config,
    read_config,
)
from .fuse import fold_act_order, fuse_projections
from .llama import CausalLM, plain_linear
from .plane_pack import pack_weight_planes
from .staged_read import fits_staged, iter_tensors_staged
from .weights import checkpoint_files, iter_tensors, resolve_model_path, validate_safetensors

logger = logging.getLogger(__name__)
_LAYER = re.compile(r"model\.layers\.(\d+)\.")
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class LoadedModel:
    model: CausalLM
    arch: ArchConfig
    path: Path
    hf_config: dict[str, Any]
    quant_spec: Any  # edge_llm.quant.QuantSpec | None
    dtype: torch.dtype
    device: torch.device
    load_seconds: float
    num_bytes: int


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but no CUDA GPU is available.")
    return dev


def resolve_dtype(dtype: str, arch: ArchConfig, quantized: bool, device: torch.device):
    """The activations' dtype. "auto": on the CPU bf16 for 4-bit checkpoints (torch's int4 CPU
    kernel is fast for bf16 only: quant/cpu_int4.py; vLLM's CPU backend also defaults to bf16)
    and fp32 otherwise (the reference path; ``dtype="float32"`` gives it for 4-bit ones too);
    on a GPU bf16 for Gemma (``ArchConfig.prefers_bf16``: its activations overflow fp16), fp16
    for other 4-bit checkpoints, else the checkpoint's bf16 or fp16. bf16 needs sm_80 or later
    (no bf16 tensor cores on the T4's sm_75): "auto" then takes fp16, as vLLM does, and an
    explicit bfloat16 is refused."""
    bf16_ok = device.type != "cuda" or torch.cuda.get_device_capability(device) >= (8, 0)
    if dtype != "auto":
        if _DTYPES[dtype] == torch.bfloat16 and not bf16_ok:
            raise ValueError(f"dtype bfloat16 needs a GPU of compute capability 8.0 or later; "
                             f"{torch.cuda.get_device_name(device)} has "
                             f"{'.'.join(map(str, torch.cuda.get_device_capability(device)))}: "
                             f"use --dtype float16.")
        return _DTYPES[dtype]
    if device.type == "cpu":
        return torch.bfloat16 if quantized else torch.float32
    if arch.prefers_bf16:
        if bf16_ok:
            return torch.bfloat16
        logger.warning("%s runs in bfloat16 (its activations overflow float16), which %s "
                       "lacks: float16 may give inf/NaN", arch.architecture,
                       torch.cuda.get_device_name(device))
        return torch.float16
    if quantized:
        return torch.float16
    if arch.torch_dtype == "bfloat16" and not bf16_ok:
        logger.warning("The checkpoint is bfloat16 but %s has no bfloat16 support; running in "
                       "float16", torch.cuda.get_device_name(device))
        return torch.float16
    return torch.bfloat16 if arch.torch_dtype == "bfloat16" else torch.float16


def _linear_factory(spec, dtype: torch.dtype):
    if spec is None:
        return plain_linear
    from edge_llm.quant import make_linear

    return lambda i, o, b: make_linear(i, o, b, spec, dtype)


def load_model(
    model: str,
    *,
    revision: str | None = None,
    dtype: str = "auto",
    device: str = "auto",
    max_positions: int | None = None,
    progress: bool = True,
    merge_projections: bool = True,
    staged: bool | None = None,
    plane_packed: bool = True,
) -> LoadedModel:
    """Load ``model`` (folder or hub id) onto ``device``. ``merge_projections``: merge q/k/v
    and gate/up into one linear each (edge_llm/model/fuse.py; False: the tests' reference of
    separate modules). ``plane_packed``: repack the 4-bit words for the plane-dot kernels
    (edge_llm/model/plane_pack.py; False: the checkpoint's word order). ``staged``: read the
    files through pinned buffers into device memory (edge_llm/model/staged_read.py) instead
    of mapping them; None: on CUDA when the GPU has room."""
    path = resolve_model_path(model, revision)
    hf_config = read_config(path)
    try:
        arch = parse_arch_config(hf_config)
    except InvalidConfigError as exc:  # name the file itself
        raise InvalidConfigError(str(exc).replace("config.json", str(path / "config.json"), 1)
                                 ) from None
    from edge_llm.quant import detect_quant_spec

    spec = detect_quant_spec(path, hf_config)
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, arch, spec is not None, dev)
    files = checkpoint_files(path)
    # refuse corrupt files before loading anything; the headers also give the tensor names
    headers = [validate_safetensors(f) for f in files]
    check_layer_count(arch.num_layers, [n for _, names in headers for n in names], path)
    total = sum(nbytes for nbytes, _ in headers)
    positions = max_positions or arch.max_position_embeddings
    if dev.type == "cuda":  # the CUDA context (seconds on a large GPU) is not weight loading
        ctx_start = time.perf_counter()
        torch.empty(1, device=dev)
        torch.cuda.synchronize(dev)
        logger.info("CUDA context on %s created in %.2f s", dev, time.perf_counter() - ctx_start)
    start = time.perf_counter()
    with torch.device("meta"):
        lm = CausalLM(arch, positions, _linear_factory(spec, torch_dtype))
    use_staged = staged_enabled(staged, dev, total, max(n for n, _ in headers))
    groups = [_renamed(arch, iter_tensors_staged([f], dev) if use_staged else iter_tensors([f]))
              for f in files]  # one per file; each reads its file when iterated
    names = [m for _, file_names in headers for n in file_names
             if (m := checkpoint_tensor_name(arch, n)) is not None]
    _load_weights(lm, groups, names, torch_dtype, dev, progress, copy=use_staged)
    if use_staged and dev.type == "cuda":
        torch.cuda.empty_cache()  # the files' blobs, now converted
    lm.finish_loading()
    if merge_projections:
        fuse_projections(lm)
        fold_act_order(lm)
    if plane_packed:
        pack_weight_planes(lm)  # after merging: concat refuses packed words
    lm.build_tables(dev)
    lm.eval()
    seconds = time.perf_counter() - start
    logger.info(
        "Loaded %s (%s%s, %s) in %.2f s: %.2f GB at %.2f GB/s (%s)",
        path.name, arch.architecture, f", {spec.method} 4-bit" if spec else "",
        str(torch_dtype).removeprefix("torch."), seconds, total / 1e9,
        total / 1e9 / max(seconds, 1e-9), "staged reads" if use_staged else "memory-mapped",
    )
    return LoadedModel(lm, arch, path, hf_config, spec, torch_dtype, dev, seconds, total)


def check_layer_count(num_layers: int, names: list[str], path: Path) -> None:
    """Refuse, before any tensor is read, a config whose ``num_hidden_layers`` differs from
    the decoder layers the checkpoint's tensors hold (``model.layers.<i>.``)."""
    found = {int(m.group(1)) for n in names if (m := _LAYER.match(n))}
    if not found or found == set(range(num_layers)):
        return
    held = f"layers 0-{max(found)}" if found == set(range(max(found) + 1)) else \
        f"{len(found)} layers with indices up to {max(found)}"
    raise InvalidConfigError(
        f"{path / 'config.json'}: num_hidden_layers={num_layers}, but the checkpoint's "
        f"tensors hold {held}: the config does not match the weights.")


def _renamed(arch: ArchConfig, group):
    """``group``'s (name, tensor) pairs under our names; the tensors we do not load (a
    multimodal checkpoint's vision tower) left out, unread where the reader is lazy."""
    for name, tensor in group:
        ours = checkpoint_tensor_name(arch, name)
        if ours is not None:
            yield ours, tensor


def staged_enabled(staged: bool | None, device: torch.device, total_bytes: int,
                   largest_file: int = 0) -> bool:
    """The ``staged`` argument, else: on CUDA when the GPU can hold the largest file beside the
    model (``fits_staged``)."""
    if staged is not None:
        return staged
    if device.type != "cuda":
        return False
    if fits_staged(total_bytes, largest_file or total_bytes, device):
        return True
    logger.info("Weights are read memory-mapped: the GPU has no room for the largest "
                "checkpoint file beside the model")
    return False


def _load_weights(
    lm: CausalLM, groups, names: list[str], dtype: torch.dtype, device: torch.device,
    progress: bool, copy: bool = False,
) -> None:
    """Fill ``lm`` from ``groups`` of (name, tensor) pairs, one group per checkpoint file;
    ``names``: every tensor name in the checkpoint. A quantized module is converted as soon
    as all of its tensors have arrived. ``copy``: the tensors are views of a file's read
    buffer, so a parameter taken as it is gets cloned, and tensors still waiting for the rest
    of their module when a file ends are cloned too: nothing of a file's buffer outlives its
    group (``_load_group`` returns before the next file is read)."""
    expected: dict[str, set[str]] = {}
    for n in names:
        prefix, _, attr = n.rpartition(".")
        expected.setdefault(prefix, set()).add(attr)
    modules = dict(lm.named_modules())
    pending: dict[str, dict[str, torch.Tensor]] = {}  # quantized module -> its format tensors
    loaded: set[str] = set()
    bar = tqdm(total=len(names), desc="Loading weights", disable=not progress, unit="tensor")
    for group in groups:
        _load_group(group, modules, expected, pending, loaded, dtype, device, copy, bar)
    bar.close()
    for prefix, tensors in pending.items():
        modules[prefix].load_checkpoint_tensors(tensors, device)
        loaded.update(f"{prefix}.{k}" for k in tensors)
    if "lm_head.weight" not in loaded and lm.model.embed_tokens.weight.device.type != "meta":
        lm.lm_head.weight = lm.model.embed_tokens.weight  # tied embeddings
    missing = [n for n, p in lm.named_parameters() if p.device.type == "meta"]
    missing += [n for n, b in lm.named_buffers() if b.device.type == "meta" and "rotary" not in n]
    if missing:
        more = "..." if len(missing) > 8 else ""
        raise ValueError(f"Checkpoint lacks tensors: {missing[:8]}{more}")


def _load_group(group, modules: dict, expected: dict[str, set[str]],
                pending: dict[str, dict[str, torch.Tensor]], loaded: set[str], dtype, device,
                copy: bool, bar) -> None:
    """One file's tensors into ``modules`` (see ``_load_weights``)."""
    from edge_llm.quant import QuantLinear

    for name, tensor in group:
        bar.update(1)
        prefix, _, attr = name.rpartition(".")
        module = modules.get(prefix)
        if module is None:
            if name.endswith("rotary_emb.inv_freq"):
                continue
            raise ValueError(f"Unexpected tensor {name!r} in the checkpoint.")
        if isinstance(module, QuantLinear):
            if attr == "weight":  # a linear the producer left unquantized: its bias (sorted
                module = _replace_with_plain(modules, prefix)  # first) may be waiting
                for k, t in pending.pop(prefix, {}).items():
                    _set_param(module, k, t, dtype, device, f"{prefix}.{k}", copy)
                    loaded.add(f"{prefix}.{k}")
            else:
                got = pending.setdefault(prefix, {})
                if attr == "bias" and module.bias is None and not torch.count_nonzero(tensor):
                    # AutoGPTQ 0.2-0.7.1 and optimum wrote a zero bias on every linear; as
                    # vLLM does, it is skipped where the model has none
                    expected[prefix].discard("bias")
                    loaded.add(name)
                else:
                    got[attr] = tensor
                if got and got.keys() >= expected[prefix]:
                    module.load_checkpoint_tensors(pending.pop(prefix), device)
                    loaded.update(f"{prefix}.{k}" for k in got)
                continue
        _set_param(module, attr, tensor, dtype, device, name, copy)
        loaded.add(name)
    if copy:
        for waiting in pending.values():
            waiting.update({k: t.clone() for k, t in waiting.items()})


def _set_param(
    module: nn.Module, attr: str, tensor: torch.Tensor, dtype, device, name: str,
    copy: bool = False,
) -> None:
    current = getattr(module, attr, None)
    if not isinstance(current, torch.Tensor):
        raise ValueError(f"Unexpected tensor {name!r} in the checkpoint.")
    if tuple(current.shape) != tuple(tensor.shape):
        raise ValueError(
            f"Tensor {name!r} has shape {tuple(tensor.shape)}, the model expects "
            f"{tuple(current.shape)}."
        )
    value = tensor.to(device=device, dtype=dtype if tensor.is_floating_point() else None,
                      copy=copy)
    setattr(module, attr, nn.Parameter(value, requires_grad=False))


def _replace_with_plain(modules: dict, prefix: str) -> nn.Linear:
    parent_name, _, child = prefix.rpartition(".")
    old = modules[prefix]
    with torch.device("meta"):
        new = nn.Linear(old.in_features, old.out_features, bias=old.bias is not None)
    setattr(modules[parent_name], child, new)
    modules[prefix] = new
    return new
