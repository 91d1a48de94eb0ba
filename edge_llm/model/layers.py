"""Building blocks of the Llama-family decoder: RMSNorm, rotary embedding, embedding.

The math runs in ``edge_llm.kernels`` (fused Triton kernels on CUDA fp16/bf16, the plain-torch
references of kernels/fused.py everywhere else)."""

from __future__ import annotations

import math

import torch
from torch import nn

from edge_llm.kernels import add_rms_norm, rms_norm, rotary

from .arch import ArchConfig


class RMSNorm(nn.Module):
    """``out_perm`` (int64 (dim,), None by default): the normed output's columns in that order,
    set by model/fuse.py when the only reader is an act-order linear sorted the same way.
    ``plus_one`` (Gemma): the checkpoint's weight w scales by 1 + w; ``fold_offset`` adds the
    1 into the weight once after loading (in fp32, then rounded to the weight's dtype), so the
    same kernels run."""

    def __init__(self, dim: int, eps: float, plus_one: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.plus_one = plus_one
        self.register_buffer("out_perm", None, persistent=False)

    def fold_offset(self) -> None:
        if self.plus_one:
            w = self.weight
            self.weight = nn.Parameter((w.float() + 1.0).to(w.dtype), requires_grad=False)
            self.plus_one = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # normalise in fp32 as transformers does, then scale in the input dtype
        return rms_norm(x, self.weight, self.eps, self.out_perm)

    def add_forward(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``residual + x`` then normalise; returns (normed, new residual)."""
        return add_rms_norm(x, residual, self.weight, self.eps, self.out_perm)


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    # Llama 3.1 frequency-dependent scaling: long wavelengths slowed by `factor`, short kept,
    # a smooth blend in between (Meta's reference implementation).
    factor = float(scaling["factor"])
    low = float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0))
    old_ctx = float(scaling.get("original_max_position_embeddings", 8192))
    low_wavelen = old_ctx / low
    high_wavelen = old_ctx / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    mid = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(mid, blended, scaled)


def _yarn_inv_freq(inv_freq: torch.Tensor, scaling: dict, base: float,
                   d: int) -> tuple[torch.Tensor, float]:
    """YaRN (transformers' ``_compute_yarn_parameters``): high frequencies kept, low ones
    interpolated by ``factor``, a linear ramp between the correction dims; cos/sin scaled by
    the attention factor (0.1 ln(factor) + 1 unless the config gives it)."""
    factor = float(scaling["factor"])
    old_ctx = float(scaling["original_max_position_embeddings"])
    attention = scaling.get("attention_factor")
    if attention is None:
        mscale, mscale_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        if mscale and mscale_all:
            attention = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all)
        else:
            attention = _yarn_mscale(factor)
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return d * math.log(old_ctx / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001  # no division by zero
    ramp = ((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: extrapolate (the frequency as trained), 0: interpolate
    return inv_freq / factor * (1 - keep) + inv_freq * keep, float(attention)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _longrope_inv_freq(inv_freq: torch.Tensor, scaling: dict, max_positions: int,
                       max_trained: int) -> tuple[torch.Tensor, float]:
    """Phi-3's LongRoPE (``su``): each frequency divided by its short or long factor, cos/sin
    scaled by sqrt(1 + ln(factor) / ln(original context)). transformers picks the long factors
    per forward when the sequence passes ``original_max_position_embeddings``; a KV cache
    needs one choice for all positions, so here (as llama.cpp does) the long factors serve
    whenever the context the model is loaded for (``max_positions``) passes it."""
    old_ctx = int(scaling["original_max_position_embeddings"])
    ext = scaling["long_factor"] if max_positions > old_ctx else scaling["short_factor"]
    ext = torch.tensor(ext, dtype=torch.float32)
    if ext.numel() != inv_freq.numel():
        raise ValueError(f"longrope factors: {ext.numel()} values for "
                         f"{inv_freq.numel()} frequencies")
    attention = scaling.get("attention_factor")
    if attention is None:
        factor = scaling.get("factor") or max_trained / old_ctx
        attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(old_ctx))
    return inv_freq / ext, float(attention)


def rope_inv_freq(theta: float, scaling: dict | None, d: int, max_positions: int,
                  max_trained: int) -> tuple[torch.Tensor, float]:
    """(inverse frequencies (d/2,) fp32, factor on cos/sin) of a RoPE setting, as transformers
    computes them: default, ``linear``, ``llama3``, ``yarn``, ``longrope``."""
    # fp32 as transformers computes it, so parity tests compare like with like
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    rope_type = None if scaling is None else scaling.get("rope_type", scaling.get("type"))
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, scaling), 1.0
    if rope_type == "linear":
        return inv_freq / float(scaling["factor"]), 1.0
    if rope_type == "yarn":
        return _yarn_inv_freq(inv_freq, scaling, theta, d)
    if rope_type == "longrope":
        return _longrope_inv_freq(inv_freq, scaling, max_positions, max_trained)
    return inv_freq, 1.0


class RotaryEmbedding(nn.Module):
    """Neox-style rotary embedding (rotate_half), cos/sin tables indexed by position.
    ``local``: the table of the sliding-window layers where they have their own base (Gemma
    3's ``local_rope_theta``, unscaled)."""

    def __init__(self, arch: ArchConfig, max_positions: int, local: bool = False) -> None:
        super().__init__()
        self.arch = arch
        self.local = local
        self.max_positions = max_positions
        if torch.get_default_device().type == "meta":
            # the loader's meta build: placeholders only (build_tables runs on the real device).
            # A meta arange would run torch's Python reference and import sympy, seconds of
            # a cold start
            half = arch.head_dim // 2
            self.register_buffer("cos", torch.empty(max_positions, half), persistent=False)
            self.register_buffer("sin", torch.empty(max_positions, half), persistent=False)
        else:
            self.build_tables(None)

    def build_tables(self, device: torch.device | str | None) -> None:
        """(Re)compute the cos/sin tables on ``device`` (the loader builds the model on meta)."""
        arch, max_positions = self.arch, self.max_positions
        if self.local:
            theta, scaling = arch.local_rope_theta, None
        else:
            theta, scaling = arch.rope_theta, arch.rope_scaling
        inv_freq, factor = rope_inv_freq(theta, scaling, arch.head_dim, max_positions,
                                         arch.max_position_embeddings)
        t = torch.arange(max_positions, dtype=torch.float32, device=device)
        inv_freq = inv_freq.to(device)
        freqs = torch.outer(t, inv_freq.float())  # (P, d/2)
        self.register_buffer("cos", freqs.cos() * factor, persistent=False)
        self.register_buffer("sin", freqs.sin() * factor, persistent=False)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # q: (T, H, D), k: (T, Hkv, D); positions: (T,); new tensors
        return rotary(q, k, self.cos, self.sin, positions)


class Embedding(nn.Embedding):
    """``nn.Embedding`` whose weight is left uninitialised on the meta device: torch's meta
    ``normal_`` runs a Python reference that imports torch._dynamo and sympy (seconds of a cold
    start), and the loader overwrites the values anyway. ``scale`` (Gemma's
    sqrt(hidden)): the rows times it, the factor rounded to the weight's dtype first as
    transformers does."""

    def __init__(self, num: int, dim: int, scale: float | None = None) -> None:
        super().__init__(num, dim)
        self.scale = scale
        # the scale rounded to each activation dtype, as a Python float: no host tensor is
        # made in forward, so a CUDA graph can capture it (a host-to-device copy cannot be)
        self._rounded: dict[torch.dtype, float] = {}

    def reset_parameters(self) -> None:
        if self.weight.device.type != "meta":
            super().reset_parameters()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = super().forward(ids)
        if self.scale is None:
            return x
        scale = self._rounded.get(x.dtype)
        if scale is None:
            scale = self._rounded[x.dtype] = torch.tensor(self.scale, dtype=x.dtype).item()
        return x * scale
