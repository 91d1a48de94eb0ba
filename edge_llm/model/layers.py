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
    set by model/fuse.py when the only reader is an act-order linear sorted the same way."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.register_buffer("out_perm", None, persistent=False)

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


class RotaryEmbedding(nn.Module):
    """Neox-style rotary embedding (rotate_half), cos/sin tables indexed by position."""

    def __init__(self, arch: ArchConfig, max_positions: int) -> None:
        super().__init__()
        self.arch = arch
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
        d = arch.head_dim
        # fp32 as transformers computes it, so parity tests compare like with like
        inv_freq = 1.0 / (arch.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
        scaling = arch.rope_scaling
        if scaling is not None:
            rope_type = scaling.get("rope_type", scaling.get("type"))
            if rope_type == "llama3":
                inv_freq = _llama3_inv_freq(inv_freq, scaling)
            elif rope_type == "linear":
                inv_freq = inv_freq / float(scaling["factor"])
        t = torch.arange(max_positions, dtype=torch.float32, device=device)
        inv_freq = inv_freq.to(device)
        freqs = torch.outer(t, inv_freq.float())  # (P, d/2)
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # q: (T, H, D), k: (T, Hkv, D); positions: (T,); new tensors
        return rotary(q, k, self.cos, self.sin, positions)


class Embedding(nn.Embedding):
    """``nn.Embedding`` whose weight is left uninitialised on the meta device: torch's meta
    ``normal_`` runs a Python reference that imports torch._dynamo and sympy (seconds of a
    cold start), and the loader overwrites the values anyway."""

    def reset_parameters(self) -> None:
        if self.weight.device.type != "meta":
            super().reset_parameters()
