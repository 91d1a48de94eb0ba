"""Logit processing before sampling (edge_llm/engine/sampler.py's order): the grammar's token
bitmask, logit_bias and min_tokens, repetition/frequency/presence penalties, top-k/top-p/min-p
filters, all in place on a float32 ``[rows, vocab]`` tensor and queued without a host sync
(host lists reach the device through ``to_device``; rows are picked with
index_select/index_copy_)."""

from __future__ import annotations

import numpy as np
import torch

from .sample_row import SampleRow


def to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list as a tensor on ``device``, the copy queued without waiting for the device
    (``torch.tensor(..., device=cuda)`` would synchronize; a non-blocking copy out of pageable
    memory is staged at once, so the list may go away)."""
    t = torch.tensor(values, dtype=dtype)
    return t if device.type == "cpu" else t.to(device, non_blocking=True)


def _flat_index(
    rows: list[int], per_row: list[list[int]], vocab: int, field_name: str, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(row index, token index) tensors ``[total]`` of every (row, token) pair, on ``device``.

    Built and range-checked on the host, so a bad id raises before anything reaches the device.
    """
    pairs_row = [r for r, toks in zip(rows, per_row, strict=True) for _ in toks]
    row_idx = torch.tensor(pairs_row, dtype=torch.long)
    tok_idx = torch.tensor([t for toks in per_row for t in toks], dtype=torch.long)
    if tok_idx.numel() and (int(tok_idx.min()) < 0 or int(tok_idx.max()) >= vocab):
        raise ValueError(f"{field_name} holds a token id outside the vocabulary [0, {vocab}).")
    return row_idx.to(device, non_blocking=True), tok_idx.to(device, non_blocking=True)


def apply_token_bitmask(x: torch.Tensor, rows: list[int], bitmask: np.ndarray) -> None:
    """In place on ``x [R, V]``: in each of ``rows``, the tokens whose bit is clear in that
    row's ``bitmask [len(rows), ceil(V / 32)]`` int32 words (bit ``t % 32`` of word
    ``t // 32``, llguidance's layout) set to -inf. Unpacked on the device: one small host
    copy, no sync."""
    dev, vocab = x.device, x.shape[1]
    words = _to_device_array(bitmask, dev)  # [n, W] int32
    shifts = torch.arange(32, dtype=torch.int32, device=dev)
    allowed = ((words.unsqueeze(-1) >> shifts) & 1).bool().flatten(1)[:, :vocab]  # [n, V]
    idx = to_device(rows, torch.long, dev)
    x.index_copy_(0, idx, x.index_select(0, idx).masked_fill(~allowed, -torch.inf))


def _to_device_array(array: np.ndarray, device: torch.device) -> torch.Tensor:
    t = torch.from_numpy(array)
    return t if device.type == "cpu" else t.to(device, non_blocking=True)


def apply_bias_and_min_tokens(x: torch.Tensor, rows: list[SampleRow]) -> None:
    """In place on ``x [R, V]``: only each row's ``allowed_token_ids`` left finite (when it
    has them); add its logit_bias; while it has fewer than ``min_tokens`` outputs, set its
    stop token ids (``all_stop_token_ids``, ``stop_token_ids`` and the model's EOS ids, which
    ``ignore_eos`` does not exempt) to -inf."""
    dev, vocab = x.device, x.shape[1]
    for i, r in enumerate(rows):
        allowed = r.params.allowed_token_ids
        if allowed:
            _, ids = _flat_index([i], [allowed], vocab, "allowed_token_ids", dev)
            keep = x[i].index_select(0, ids)
            x[i].fill_(-torch.inf)
            x[i].index_copy_(0, ids, keep)
    bias_rows = [i for i, r in enumerate(rows) if r.params.logit_bias]
    if bias_rows:
        biases = [rows[i].params.logit_bias for i in bias_rows]
        r_idx, t_idx = _flat_index(bias_rows, [list(b) for b in biases], vocab, "logit_bias", dev)
        vals = to_device([v for b in biases for v in b.values()], x.dtype, dev)
        x.index_put_((r_idx, t_idx), vals, accumulate=True)
    min_rows = [i for i, r in enumerate(rows) if len(r.output_token_ids) < r.params.min_tokens]
    if min_rows:
        stops = [
            sorted(set(rows[i].params.all_stop_token_ids) | set(rows[i].params.stop_token_ids)
                   | rows[i].params.eos_token_ids)
            for i in min_rows
        ]
        r_idx, t_idx = _flat_index(min_rows, stops, vocab, "stop_token_ids", dev)
        x.index_put_((r_idx, t_idx), torch.full((), -torch.inf, dtype=x.dtype, device=dev))


def apply_penalties(x: torch.Tensor, rows: list[SampleRow]) -> None:
    """In place on ``x [R, V]``: repetition penalty over prompt + output tokens (positive logits
    divided, the others multiplied), then ``- frequency * count - presence * (count > 0)`` over
    output tokens only."""
    idx = [
        i
        for i, r in enumerate(rows)
        if r.params.repetition_penalty != 1.0
        or r.params.frequency_penalty != 0.0
        or r.params.presence_penalty != 0.0
    ]
    if not idx:
        return
    dev, n, vocab = x.device, len(idx), x.shape[1]
    sub_rows = list(range(n))
    outputs = [rows[i].output_token_ids for i in idx]
    counts = torch.zeros(n, vocab, dtype=x.dtype, device=dev)  # [n, V] output-token counts
    r_out, t_out = _flat_index(sub_rows, outputs, vocab, "output_token_ids", dev)
    counts.index_put_((r_out, t_out), torch.ones_like(t_out, dtype=x.dtype), accumulate=True)
    seen = counts > 0  # [n, V]
    prompts = [rows[i].prompt_token_ids for i in idx]
    r_p, t_p = _flat_index(sub_rows, prompts, vocab, "prompt_token_ids", dev)
    seen_any = seen.clone()
    seen_any.index_put_((r_p, t_p), torch.ones((), dtype=torch.bool, device=dev))

    def column(name: str) -> torch.Tensor:  # [n, 1]
        vals = [float(getattr(rows[i].params, name)) for i in idx]
        return to_device(vals, x.dtype, dev).unsqueeze(1)

    idx_t = to_device(idx, torch.long, dev)
    sub = x.index_select(0, idx_t)  # [n, V]
    rep = column("repetition_penalty")
    scaled = torch.where(sub > 0, sub / rep, sub * rep)
    sub = torch.where(seen_any, scaled, sub)
    sub = sub - column("frequency_penalty") * counts - column("presence_penalty") * seen
    x.index_copy_(0, idx_t, sub)


def apply_top_k_top_p_min_p(
    x: torch.Tensor, top_k: list[int], top_p: list[float], min_p: list[float]
) -> None:
    """In place on temperature-scaled ``x [R, V]``, filtered tokens set to -inf:

    * top_k (k < 1 or k >= V: off): keep logits >= the k-th largest (ties at the edge kept);
    * top_p (1.0: off): keep the smallest set of most likely tokens whose mass reaches top_p,
      i.e. a token stays when the mass strictly before it in descending order is < top_p;
    * min_p (0: off): keep tokens with prob >= min_p * max prob, i.e. logit >= max + log(min_p).
    """
    dev, vocab = x.device, x.shape[1]
    k_rows = [i for i, k in enumerate(top_k) if 0 < k < vocab]
    if k_rows:
        k_list = [top_k[i] for i in k_rows]
        ks = to_device(k_list, torch.long, dev)
        rows_t = to_device(k_rows, torch.long, dev)
        sub = x.index_select(0, rows_t)  # [nk, V]
        top_vals = sub.topk(max(k_list), dim=-1).values  # [nk, kmax], descending
        kth = top_vals.gather(1, (ks - 1).unsqueeze(1))  # [nk, 1]
        x.index_copy_(0, rows_t, sub.masked_fill(sub < kth, -torch.inf))
    p_rows = [i for i, p in enumerate(top_p) if p < 1.0]
    if p_rows:
        ps = to_device([top_p[i] for i in p_rows], x.dtype, dev).unsqueeze(1)
        rows_t = to_device(p_rows, torch.long, dev)
        sub = x.index_select(0, rows_t)  # [np, V]
        sorted_vals, order = sub.sort(dim=-1, descending=True)
        probs = sorted_vals.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # exclusive cumulative mass, [np, V]
        drop_sorted = mass_before >= ps
        drop_sorted[:, 0] = False  # the most likely token always stays
        drop = torch.empty_like(drop_sorted).scatter_(1, order, drop_sorted)
        x.index_copy_(0, rows_t, sub.masked_fill(drop, -torch.inf))
    m_rows = [i for i, m in enumerate(min_p) if m > 0.0]
    if m_rows:
        ms = to_device([min_p[i] for i in m_rows], x.dtype, dev).unsqueeze(1)
        rows_t = to_device(m_rows, torch.long, dev)
        sub = x.index_select(0, rows_t)  # [nm, V]
        floor = sub.max(dim=-1, keepdim=True).values + ms.log()
        x.index_copy_(0, rows_t, sub.masked_fill(sub < floor, -torch.inf))
