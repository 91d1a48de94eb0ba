"""Which 4-bit format a checkpoint folder holds, read from its config files; refusals that say why.

Sources, first match wins:

1. ``config.json["quantization_config"]`` (transformers, AutoAWQ >= 0.2, GPTQModel, llm-compressor);
2. ``quantize_config.json`` (AutoGPTQ / GPTQModel; a few AWQ repos put AutoAWQ keys here too);
3. ``quant_config.json`` (AutoAWQ: ``w_bit``, ``q_group_size``, ``zero_point``, ``version``).

No source means an unquantized model (``None``). Anything we cannot serve bit-exactly raises
:class:`UnsupportedQuantizationError` naming what was found and what is supported.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

SUPPORTED_QUANT_FORMATS = (
    "AWQ GEMM (quant_method 'awq', version 'gemm', 4-bit, any group size); "
    "GPTQ (quant_method 'gptq', checkpoint_format 'gptq' or 'gptq_v2', 4-bit, int32 packing, "
    "group size -1/32/64/128/..., sym or asym, desc_act/act-order); "
    "compressed-tensors 'pack-quantized' (4-bit int weight-only, strategy 'group' or 'channel', "
    "sym or asym, optional actorder); "
    "AutoRound (quant_method 'auto-round', packing_format 'auto_round:auto_gptq', 4-bit int)"
)

_AWQ_VERSIONS_REFUSED = ("gemv", "gemv_fast", "marlin", "exllama", "ipex")
_GPTQ_FORMATS = ("gptq", "gptq_v2")


class UnsupportedQuantizationError(ValueError):
    """A checkpoint's quantization scheme that edge-llm cannot serve; the message says why."""

    def __init__(self, found: str, source: str) -> None:
        super().__init__(
            f"Unsupported quantization in {source}: {found}. Supported: {SUPPORTED_QUANT_FORMATS}."
        )


@dataclass(frozen=True)
class QuantSpec:
    """How a checkpoint's linears are quantized; enough to build and load ``QuantLinear``.

    ``group_size`` is -1 when one group spans all of K (GPTQ ``group_size=-1``, compressed-tensors
    ``strategy="channel"``). ``skip_modules`` lists modules the producer left unquantized: plain
    entries match as substrings (AutoAWQ ``modules_to_not_convert``), ``re:``-prefixed entries as
    regular expressions from the start of the name (compressed-tensors ``ignore``, GPTQModel
    ``dynamic`` ``-:`` rules).
    """

    method: str  # "awq" | "gptq" | "compressed-tensors"
    bits: int = 4
    group_size: int = 128
    sym: bool = False
    desc_act: bool = False
    zero_point: bool = True  # awq: zeros stored in qzeros; False means implicit 8 when absent
    checkpoint_format: str = "gptq"  # gptq: "gptq" (v1, zeros stored minus one) | "gptq_v2"
    version: str = "gemm"  # awq packing
    skip_modules: tuple[str, ...] = ()
    source: str = "config.json"

    def __post_init__(self) -> None:
        if self.method not in ("awq", "gptq", "compressed-tensors"):
            raise ValueError(
                f"QuantSpec.method must be awq/gptq/compressed-tensors, got {self.method!r}."
            )
        if self.bits != 4:
            raise ValueError(f"QuantSpec.bits must be 4, got {self.bits}.")
        if self.group_size != -1 and self.group_size < 1:
            raise ValueError(f"QuantSpec.group_size must be -1 or >= 1, got {self.group_size}.")
        if self.checkpoint_format not in _GPTQ_FORMATS:
            raise ValueError(
                f"QuantSpec.checkpoint_format must be one of {_GPTQ_FORMATS}, "
                f"got {self.checkpoint_format!r}."
            )

    def group_size_for(self, in_features: int) -> int:
        """Rows of K per group for a linear with ``in_features`` inputs (-1 means all of K)."""
        return in_features if self.group_size == -1 else self.group_size


def is_quantized_module_name(name: str, spec: QuantSpec | None) -> bool:
    """Whether the linear ``name`` (e.g. ``model.layers.0.mlp.up_proj``) is quantized.

    Embeddings and ``lm_head`` stay in floating point in every supported format; so do the
    modules the producer listed in ``spec.skip_modules``.
    """
    if spec is None:
        return False
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "lm_head" or "embed" in leaf:
        return False
    for rule in spec.skip_modules:
        if rule.startswith("re:"):
            if re.match(rule[3:], name):
                return False
        elif rule and rule in name:
            return False
    return True


def detect_quant_spec(model_dir: str | Path, config: dict[str, Any]) -> QuantSpec | None:
    """Read the quantization scheme of the checkpoint in ``model_dir``; None when unquantized."""
    model_dir = Path(model_dir)
    # compressed-tensors <= 0.6 wrote its config as "compression_config" (vLLM reads both)
    qc = config.get("quantization_config", config.get("compression_config"))
    if qc is not None:
        if not isinstance(qc, dict):
            raise ValueError(f"config.json: quantization_config must be an object, got {qc!r}.")
        return parse_quantization_config(qc, "config.json quantization_config")
    for file in ("quantize_config.json", "quant_config.json"):
        path = model_dir / file
        if path.is_file():
            try:
                data = json.loads(path.read_text())
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}: not valid JSON ({exc}).") from exc
            if not isinstance(data, dict):
                raise ValueError(f"{path}: expected a JSON object.")
            return parse_quantization_config(data, file)
    return None


def parse_quantization_config(qc: dict[str, Any], source: str) -> QuantSpec:
    """Turn one producer's quantization config dict into a :class:`QuantSpec` (or refuse it)."""
    method = str(qc.get("quant_method", "")).lower()
    if not method:  # old AutoGPTQ files carry no quant_method; AutoAWQ files carry w_bit/version
        method = "awq" if {"w_bit", "q_group_size", "version"} & set(qc) else "gptq"
    if method == "awq":
        return _parse_awq(qc, source)
    if method == "gptq":
        return _parse_gptq(qc, source)
    if method == "compressed-tensors":
        return _parse_compressed(qc, source)
    if method in ("auto-round", "intel/auto-round"):
        return _parse_autoround(qc, source)
    raise UnsupportedQuantizationError(f"quant_method {method!r}", source)


def _bits(qc: dict[str, Any], keys: tuple[str, ...], source: str) -> int:
    for key in keys:
        if key in qc:
            bits = qc[key]
            if bits != 4:
                raise UnsupportedQuantizationError(f"{key}={bits!r} (only 4-bit weights)", source)
            return 4
    raise ValueError(f"{source}: missing the number of bits (one of {list(keys)}).")


def _group_size(qc: dict[str, Any], keys: tuple[str, ...], source: str, default: int | None):
    for key in keys:
        if key in qc and qc[key] is not None:
            value = qc[key]
            if not isinstance(value, int) or isinstance(value, bool) or (value < 1 and value != -1):
                raise ValueError(
                    f"{source}: {key} must be -1 or a positive integer, got {value!r}."
                )
            return value
    if default is None:
        raise ValueError(f"{source}: missing the group size (one of {list(keys)}).")
    return default


def _parse_awq(qc: dict[str, Any], source: str) -> QuantSpec:
    bits = _bits(qc, ("bits", "w_bit"), source)
    group_size = _group_size(qc, ("group_size", "q_group_size"), source, None)
    version = str(qc.get("version", "gemm")).lower()
    if version != "gemm":
        refused = "is" if version in _AWQ_VERSIONS_REFUSED else "is an unknown version"
        raise UnsupportedQuantizationError(f"AWQ version {version!r} ({refused} not GEMM)", source)
    backend = str(qc.get("backend", "autoawq")).lower()
    if backend == "llm-awq":  # llm-awq's own packing differs from AutoAWQ GEMM
        raise UnsupportedQuantizationError("AWQ backend 'llm-awq'", source)
    skip = qc.get("modules_to_not_convert") or ()
    return QuantSpec(
        method="awq", bits=bits, group_size=group_size,
        sym=not bool(qc.get("zero_point", True)), zero_point=bool(qc.get("zero_point", True)),
        version="gemm", skip_modules=tuple(str(m) for m in skip), source=source,
    )


def _parse_gptq(qc: dict[str, Any], source: str) -> QuantSpec:
    bits = _bits(qc, ("bits",), source)
    group_size = _group_size(qc, ("group_size",), source, -1)
    fmt = str(qc.get("checkpoint_format") or qc.get("format") or "gptq").lower()
    if qc.get("is_marlin_format"):
        fmt = "marlin"
    if fmt not in _GPTQ_FORMATS:
        raise UnsupportedQuantizationError(f"GPTQ checkpoint_format {fmt!r}", source)
    pack_dtype = str(qc.get("pack_dtype", "int32")).lower().removeprefix("torch.")
    if pack_dtype != "int32":
        raise UnsupportedQuantizationError(f"GPTQ pack_dtype {pack_dtype!r}", source)
    if qc.get("lm_head"):
        raise UnsupportedQuantizationError("a quantized lm_head (lm_head=true)", source)
    return QuantSpec(
        method="gptq", bits=bits, group_size=group_size, sym=bool(qc.get("sym", True)),
        desc_act=bool(qc.get("desc_act", False)), zero_point=not bool(qc.get("sym", True)),
        checkpoint_format=fmt, skip_modules=_gptqmodel_dynamic_skips(qc.get("dynamic"), source),
        source=source,
    )


def _parse_autoround(qc: dict[str, Any], source: str) -> QuantSpec:
    """AutoRound with its AutoGPTQ packing (``packing_format`` "auto_round:auto_gptq", the
    default, or an older ``backend`` "auto_round:gptq:..."): GPTQ v1 words (zero minus one,
    as its exporter's ``pack`` writes), no act-order. ``extra_config`` layers kept at 16 bits
    are plain linears; other per-layer settings, its AWQ packing and activation quantization
    are refused."""
    fmt = str(qc.get("packing_format") or qc.get("backend") or "auto_round:auto_gptq").lower()
    if "gptq" not in fmt:
        raise UnsupportedQuantizationError(f"AutoRound packing_format {fmt!r}", source)
    if str(qc.get("data_type", "int")).lower() != "int" or int(qc.get("act_bits") or 16) < 16:
        raise UnsupportedQuantizationError("AutoRound with float weights or quantized "
                                           "activations", source)
    extra = qc.get("extra_config") or {}
    if not isinstance(extra, dict):
        raise ValueError(f"{source}: extra_config must be an object, got {extra!r}.")
    for name, layer in extra.items():
        if not (isinstance(layer, dict) and int(layer.get("bits", 16)) >= 16):
            raise UnsupportedQuantizationError(
                f"AutoRound per-layer settings (extra_config {name!r})", source)
    spec = _parse_gptq({**qc, "checkpoint_format": "gptq", "desc_act": False, "dynamic": None,
                        "lm_head": False}, source)
    return replace(spec, skip_modules=tuple(str(n) for n in extra))


def _gptqmodel_dynamic_skips(dynamic: Any, source: str) -> tuple[str, ...]:
    """GPTQModel ``dynamic``: ``-:regex`` keys skip modules; per-module overrides are refused."""
    if not dynamic:
        return ()
    if not isinstance(dynamic, dict):
        raise ValueError(f"{source}: dynamic must be an object, got {dynamic!r}.")
    skips = []
    for key in dynamic:
        if not str(key).startswith("-:"):
            raise UnsupportedQuantizationError(
                f"GPTQModel per-module overrides (dynamic key {key!r})", source
            )
        skips.append("re:" + str(key)[2:])
    return tuple(skips)


def _parse_compressed(qc: dict[str, Any], source: str) -> QuantSpec:
    fmt = qc.get("format")
    if fmt != "pack-quantized":
        raise UnsupportedQuantizationError(f"compressed-tensors format {fmt!r}", source)
    sparsity = qc.get("sparsity_config")
    if sparsity and not (isinstance(sparsity, dict) and sparsity.get("format") == "dense"):
        # "dense" (llm-compressor 0.2-0.5 wrote it when >= 5% of weights are zero): stored as
        # they are, no sparse compression
        raise UnsupportedQuantizationError("compressed-tensors with a sparsity_config", source)
    if qc.get("transform_config"):  # e.g. QuIP / SpinQuant rotations applied at run time
        raise UnsupportedQuantizationError("compressed-tensors with a transform_config", source)
    if qc.get("kv_cache_scheme"):
        raise UnsupportedQuantizationError("compressed-tensors with a kv_cache_scheme", source)
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise ValueError(f"{source}: compressed-tensors config_groups must be a non-empty object.")
    specs = {_parse_compressed_group(name, g, source) for name, g in groups.items()}
    if len(specs) != 1:
        raise UnsupportedQuantizationError(
            "compressed-tensors config_groups with different weight schemes", source
        )
    group_size, sym, desc_act = specs.pop()
    ignore = qc.get("ignore") or ()
    return QuantSpec(
        method="compressed-tensors", bits=4, group_size=group_size, sym=sym, desc_act=desc_act,
        zero_point=not sym, skip_modules=tuple(_ct_rule(str(r)) for r in ignore), source=source,
    )


def _ct_rule(rule: str) -> str:
    # compressed-tensors ignore entries are "re:<regex>" or an exact module name
    return rule if rule.startswith("re:") else "re:" + re.escape(rule) + "$"


def _parse_compressed_group(name: str, group: Any, source: str) -> tuple[int, bool, bool]:
    where = f"{source} config_groups.{name}"
    if not isinstance(group, dict):
        raise ValueError(f"{where}: must be an object.")
    group_fmt = group.get("format")
    if group_fmt not in (None, "pack-quantized"):
        raise UnsupportedQuantizationError(f"group format {group_fmt!r}", where)
    if group.get("input_activations") or group.get("output_activations"):
        raise UnsupportedQuantizationError(
            "activation quantization (only weight-only W4A16)", where
        )
    w = group.get("weights")
    if not isinstance(w, dict):
        raise ValueError(f"{where}: missing the 'weights' object.")
    if w.get("num_bits") != 4 or w.get("type", "int") != "int":
        raise UnsupportedQuantizationError(
            f"weights num_bits={w.get('num_bits')!r} type={w.get('type')!r}", where
        )
    if w.get("dynamic"):
        raise UnsupportedQuantizationError("dynamic weight quantization", where)
    strategy = w.get("strategy")
    if strategy == "channel":
        group_size = -1
    elif strategy == "group":
        group_size = _group_size(w, ("group_size",), where, None)
    else:
        raise UnsupportedQuantizationError(f"weights strategy {strategy!r}", where)
    actorder = w.get("actorder")
    desc_act = actorder in (True, "group", "dynamic")
    return group_size, bool(w.get("symmetric", True)), desc_act
