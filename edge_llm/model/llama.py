"""Llama-family decoder (Llama, Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3, Phi-3) over a paged
KV cache; what a family changes is a field of ``ArchConfig`` (edge_llm/model/arch.py).

Module names follow transformers' so checkpoint tensors map one to one. Linear layers come from
a factory so the same code runs fp16/bf16/fp32 weights and every 4-bit format.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

from edge_llm.kernels import gelu_tanh_and_mul, paged_attention, rotary_write_kv, silu_and_mul
from edge_llm.kernels.pdl import forward_tokens

from .arch import ArchConfig
from .attention_metadata import AttentionMetadata
from .layers import Embedding, RMSNorm, RotaryEmbedding

# (in_features, out_features, bias) -> module with .forward(x)
LinearFactory = Callable[[int, int, bool], nn.Module]
KVCache = tuple[torch.Tensor, torch.Tensor]


def plain_linear(in_features: int, out_features: int, bias: bool) -> nn.Module:
    return nn.Linear(in_features, out_features, bias=bias)


class Attention(nn.Module):
    def __init__(self, arch: ArchConfig, linear: LinearFactory, rotary: RotaryEmbedding,
                 window: int | None = None) -> None:
        super().__init__()
        self.num_heads = arch.num_heads
        self.num_kv_heads = arch.num_kv_heads
        self.head_dim = arch.head_dim
        self.scale = arch.attn_scale if arch.attn_scale is not None else arch.head_dim**-0.5
        self.window = window  # keys at positions > query position - window (None: all)
        self.softcap = arch.attn_softcap
        h, d = arch.hidden_size, arch.head_dim
        qkv_out = (self.num_heads + 2 * self.num_kv_heads) * d
        # [q | k | v] columns in one linear: in the checkpoint (Phi-3), or set by
        # edge_llm/model/fuse.py after loading, which deletes q_proj/k_proj/v_proj (the
        # checkpoint names still load first)
        self.qkv_proj: nn.Module | None = None
        if arch.merged_checkpoint:
            self.qkv_proj = linear(h, qkv_out, arch.qkv_bias)
        else:
            self.q_proj = linear(h, self.num_heads * d, arch.qkv_bias)
            self.k_proj = linear(h, self.num_kv_heads * d, arch.qkv_bias)
            self.v_proj = linear(h, self.num_kv_heads * d, arch.qkv_bias)
        self.o_proj = linear(self.num_heads * d, h, False)
        if arch.qk_norm:
            self.q_norm = RMSNorm(d, arch.rms_norm_eps, arch.norm_plus_one)
            self.k_norm = RMSNorm(d, arch.rms_norm_eps, arch.norm_plus_one)
        self.qk_norm = arch.qk_norm
        self._rotary = [rotary]  # shared, kept out of this module's state dict

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, kv: KVCache, meta: AttentionMetadata
    ) -> torch.Tensor:
        t = x.shape[0]
        h, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        if self.qkv_proj is not None:
            qkv = self.qkv_proj(x).view(t, h + 2 * hkv, d)  # (T, H + 2 Hkv, D)
            # views, row stride (H + 2 Hkv) D: rotary, qk-norm and write_kv take strides
            q, k, v = qkv.split((h, hkv, hkv), dim=1)  # (T, H, D), (T, Hkv, D), (T, Hkv, D)
        else:
            q = self.q_proj(x).view(t, h, d)  # (T, H, D)
            k = self.k_proj(x).view(t, hkv, d)  # (T, Hkv, D)
            v = self.v_proj(x).view(t, hkv, d)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        k_cache, v_cache = kv
        rot = self._rotary[0]  # q rotated; k rotated and v stored at their cache slots
        q = rotary_write_kv(q, k, v, rot.cos, rot.sin, positions, k_cache, v_cache,
                            meta.slot_mapping, meta.scratch)
        o = paged_attention(
            q, k_cache, v_cache, meta.block_tables, meta.query_start_loc, meta.seq_lens,
            self.scale, meta.max_query_len, meta.max_seq_len, meta.scratch,
            window=self.window, softcap=self.softcap,
        )
        return self.o_proj(o.reshape(t, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, arch: ArchConfig, linear: LinearFactory) -> None:
        super().__init__()
        h, i = arch.hidden_size, arch.intermediate_size
        # [gate | up] columns in one linear: in the checkpoint (Phi-3), or set by
        # edge_llm/model/fuse.py, which deletes the two
        self.gate_up_proj: nn.Module | None = None
        if arch.merged_checkpoint:
            self.gate_up_proj = linear(h, 2 * i, False)
        else:
            self.gate_proj = linear(h, i, False)
            self.up_proj = linear(h, i, False)
        self.down_proj = linear(i, h, False)
        self.gelu = arch.mlp_act == "gelu_tanh"  # else SiLU

    def _act(self, gate: torch.Tensor, up: torch.Tensor | None = None) -> torch.Tensor:
        return gelu_tanh_and_mul(gate, up) if self.gelu else silu_and_mul(gate, up)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_proj is not None:
            fused = None if self.gelu else getattr(self.gate_up_proj, "forward_silu_mul", None)
            h = fused(x) if fused is not None else None  # maybe in the GEMV's epilogue
            if h is None:
                h = self._act(self.gate_up_proj(x))  # (T, 2I) -> (T, I)
            return self.down_proj(h)
        return self.down_proj(self._act(self.gate_proj(x), self.up_proj(x)))


class DecoderLayer(nn.Module):
    """Llama order: x -> input norm -> attention -> + residual -> post-attention norm -> MLP.
    Gemma's sandwich (``arch.sandwich_norms``): attention's output goes through
    post_attention_layernorm before the residual add, the MLP's input comes from
    pre_feedforward_layernorm and its output goes through post_feedforward_layernorm::

        h = attn(input_layernorm(x));  x = x + post_attention_layernorm(h)
        h = mlp(pre_feedforward_layernorm(x));  x = x + post_feedforward_layernorm(h)

    Each residual add is fused into the next norm (``add_forward``), so ``forward`` returns
    the branch output not yet added, beside the residual."""

    def __init__(self, arch: ArchConfig, linear: LinearFactory, rotary: RotaryEmbedding,
                 window: int | None = None) -> None:
        super().__init__()
        self.self_attn = Attention(arch, linear, rotary, window)
        self.mlp = MLP(arch, linear)
        hidden, eps, one = arch.hidden_size, arch.rms_norm_eps, arch.norm_plus_one
        self.input_layernorm = RMSNorm(hidden, eps, one)
        self.post_attention_layernorm = RMSNorm(hidden, eps, one)
        self.sandwich = arch.sandwich_norms
        if self.sandwich:
            self.pre_feedforward_layernorm = RMSNorm(hidden, eps, one)
            self.post_feedforward_layernorm = RMSNorm(hidden, eps, one)

    @property
    def mlp_input_norm(self) -> RMSNorm:
        """The norm whose output is the MLP's input (model/fuse.py folds gathers into it)."""
        return self.pre_feedforward_layernorm if self.sandwich else self.post_attention_layernorm

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        positions: torch.Tensor,
        kv: KVCache,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = x
            h = self.input_layernorm(x)
        else:
            h, residual = self.input_layernorm.add_forward(x, residual)
        h = self.self_attn(h, positions, kv, meta)
        if self.sandwich:
            h = self.post_attention_layernorm(h)
        h, residual = self.mlp_input_norm.add_forward(h, residual)
        h = self.mlp(h)
        if self.sandwich:
            h = self.post_feedforward_layernorm(h)
        return h, residual


class Model(nn.Module):
    def __init__(self, arch: ArchConfig, linear: LinearFactory, rotary: RotaryEmbedding,
                 local_rotary: RotaryEmbedding | None = None) -> None:
        super().__init__()
        self.embed_tokens = Embedding(arch.vocab_size, arch.hidden_size, arch.embed_scale)
        windows = [arch.layer_window(i) for i in range(arch.num_layers)]
        self.layers = nn.ModuleList(
            DecoderLayer(arch, linear, rotary if w is None or local_rotary is None
                         else local_rotary, w) for w in windows
        )
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, arch.norm_plus_one)


class CausalLM(nn.Module):
    """``forward`` returns final hidden states (T, hidden); ``compute_logits`` projects rows."""

    def __init__(
        self, arch: ArchConfig, max_positions: int, linear: LinearFactory = plain_linear
    ) -> None:
        super().__init__()
        self.arch = arch
        self.rotary = RotaryEmbedding(arch, max_positions)
        # the sliding layers' own table (Gemma 3), else None
        self.local_rotary = (RotaryEmbedding(arch, max_positions, local=True)
                             if arch.local_rope_theta is not None else None)
        self.model = Model(arch, linear, self.rotary, self.local_rotary)
        # lm_head stays unquantized in every published 4-bit checkpoint
        self.lm_head = nn.Linear(arch.hidden_size, arch.vocab_size, bias=False)
        self.num_active_layers: int | None = None  # see first_layers

    def build_tables(self, device: torch.device | str | None) -> None:
        """The RoPE tables on ``device`` (the loader builds the model on meta)."""
        for rot in (self.rotary, self.local_rotary):
            if rot is not None:
                rot.build_tables(device)

    def finish_loading(self) -> None:
        """After the checkpoint's tensors are in: Gemma's (1 + weight) norms folded."""
        for module in self.modules():
            if isinstance(module, RMSNorm):
                module.fold_offset()

    @contextlib.contextmanager
    def first_layers(self, n: int) -> Iterator[None]:
        """Within it, ``forward`` runs only the first ``n`` decoder layers (their caches the
        first ``n`` of ``kv_caches``). For the start-up's warm-up forwards, whose only purpose
        is to load every kernel variant a forward launches before serving or a graph capture:
        every layer has the same shapes, so launches the same variants as the first."""
        if not 1 <= n <= len(self.model.layers):
            raise ValueError(f"n must be 1..{len(self.model.layers)}, got {n}")
        before, self.num_active_layers = self.num_active_layers, n
        try:
            yield
        finally:
            self.num_active_layers = before

    def forward(
        self,
        input_ids: torch.Tensor,  # (T,)
        positions: torch.Tensor,  # (T,)
        kv_caches: list[KVCache],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        with forward_tokens(input_ids.shape[0]):  # PDL decides by it (kernels/pdl.py)
            x = self.model.embed_tokens(input_ids)  # (T, hidden)
            residual = None
            layers, n = self.model.layers, self.num_active_layers
            if n is not None:  # first_layers
                layers, kv_caches = layers[:n], kv_caches[:n]
            for layer, kv in zip(layers, kv_caches, strict=True):
                x, residual = layer(x, residual, positions, kv, meta)
            x, _ = self.model.norm.add_forward(x, residual)
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        w = self.lm_head.weight  # (vocab, hidden)
        if hidden.shape[0] == 1 and hidden.device.type == "cpu" and w.dtype == torch.bfloat16:
            # one bf16 row on the CPU (a batch-1 decode): torch.mv reads the weight as it is,
            # where linear's bf16 matmul is slower (BENCHMARKS.md, "CPU")
            logits = torch.mv(w, hidden[0]).float().unsqueeze(0)  # (1, vocab)
        else:
            logits = self.lm_head(hidden).float()  # (rows, vocab)
        cap = self.arch.final_softcap
        if cap:  # Gemma 2: cap * tanh(logits / cap), in fp32
            logits = torch.tanh(logits / cap) * cap
        return logits
