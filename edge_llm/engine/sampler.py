"""Batched next-token sampling with vLLM's parameters and order.

Order of operations on one step's logits ``[num_rows, vocab]`` (all float32):

    grammar bitmask (constrained rows: tokens the matcher disallows -> -inf)
      ->  logit_bias (+)  ->  min_tokens (stop ids -> -inf)
      ->  repetition penalty (prompt + output)
      ->  frequency / presence penalties (output only)          = "penalized" logits
      ->  greedy rows: argmax (ties -> lowest id)
      ->  random rows: / temperature -> top_k -> top_p -> min_p -> softmax
          -> argmax(probs / Exponential(1) noise)               (the exponential race)

The top_k -> top_p -> min_p order is vLLM v0's; vLLM v1 applies min_p before top_k/top_p. The
two only differ when top_p and min_p are both set: min_p is a threshold relative to the largest
logit, so it commutes with top_k, but not with top_p's mass over the renormalized survivors.

Logprobs. vLLM v0 (<= 0.6) returned log-softmax of the logits actually sampled from (after
penalties, temperature, top-k/top-p: filtered tokens read -inf; vllm-project/vllm#9453 reports
this as incompatible with OpenAI). vLLM v1 defaults to ``logprobs_mode="raw_logprobs"``: the
model's logits before any processing. Our default, ``"penalized_logprobs"``, sits between them:
log-softmax after logit_bias, min_tokens and the penalties, before temperature and the
top-k/top-p/min-p filters, so a logprob does not change with temperature or top_p, and a
logit_bias shows in it. ``"raw_logprobs"`` and ``"processed_logprobs"`` give vLLM v1's and
vLLM v0's behaviour (for greedy rows "processed" equals "penalized").

Host syncs. Everything up to the final packed tensor is queued on the device without waiting
for it (``Sampler.sample_on_device``): per-row parameters and row indices travel as host lists
copied with ``non_blocking`` (``to_device``), rows are picked with ``index_select`` /
``index_copy_`` rather than list indexing (which copies its index synchronously), and sizes
such as top-k's largest k come from the host lists. The one device->host copy is the
``tolist()`` of the packed result (``SamplerOutput`` needs host ids).

Seeds. A seeded row draws its noise from its own ``torch.Generator``, created from
``(params.seed, choice_index)`` on first use and kept under ``generator_key`` until
``forget(key)``; each step it draws exactly ``vocab`` uniforms, so its tokens do not depend on
what else is in the batch. Unseeded rows share one generator seeded from the engine seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from edge_llm.outputs import Logprob
from edge_llm.sampling_params import SamplingType

from .sample_row import SampleRow
from .sampler_logits import (  # noqa: F401 - re-exported: tests and callers import them here
    apply_bias_and_min_tokens,
    apply_penalties,
    apply_token_bitmask,
    apply_top_k_top_p_min_p,
    to_device,
)
from .structured_output import fill_bitmasks

__all__ = ["Sampler", "SampleRow", "SamplerOutput", "choice_seed", "compute_prompt_logprobs"]

LogprobsMode = Literal["raw_logprobs", "penalized_logprobs", "processed_logprobs"]
LOGPROBS_MODES: tuple[str, ...] = ("raw_logprobs", "penalized_logprobs", "processed_logprobs")

_U64 = (1 << 64) - 1


@dataclass
class SamplerOutput:
    """Per row: the sampled token id; ``{token_id: logprob}`` (the sampled token first, then
    the top ``params.logprobs``) or None; the sampled token's logprob, or None, when the row's
    ``params.logprobs`` is None."""

    token_ids: list[int]
    logprobs: list[dict[int, Logprob] | None]
    sampled_logprobs: list[float | None]


def choice_seed(seed: int, choice_index: int) -> int:
    """The 64-bit generator seed of choice ``choice_index`` of a request seeded with ``seed``.

    Choice 0 uses the seed itself; the others a splitmix64 mix of (seed, index), so the n
    choices of one seeded request draw different noise, reproducibly across processes.
    """
    if choice_index == 0:
        return seed & _U64
    z = (seed + choice_index * 0x9E3779B97F4A7C15) & _U64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _U64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _U64
    return z ^ (z >> 31)


class Sampler:
    """Samples one token per row of a step's logits; see the module docstring for the order.

    ``seed`` seeds the generator of unseeded rows. Call ``forget(key)`` when the sequence with
    ``generator_key == key`` finishes, so its generator is dropped.
    """

    def __init__(self, seed: int = 0, logprobs_mode: LogprobsMode = "penalized_logprobs"):
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(
                f"logprobs_mode must be one of {LOGPROBS_MODES}, got {logprobs_mode!r}."
            )
        self.seed = seed
        self.logprobs_mode = logprobs_mode
        self._shared: dict[torch.device, torch.Generator] = {}
        self._seeded: dict[int, torch.Generator] = {}

    def forget(self, key: int) -> None:
        """Drop the generator of sequence ``key`` (no-op when it has none)."""
        self._seeded.pop(key, None)

    @property
    def num_seeded(self) -> int:
        return len(self._seeded)

    def snapshot(self, keys: list[int]) -> tuple[dict, dict]:
        """The generators' states (the shared ones, and sequence ``keys``' own; None for a
        key without one yet), for ``restore`` after a step whose draws are dropped."""
        return ({dev: g.get_state() for dev, g in self._shared.items()},
                {k: (g.get_state() if (g := self._seeded.get(k)) is not None else None)
                 for k in keys})

    def restore(self, snap: tuple[dict, dict]) -> None:
        """Put the generators back as ``snapshot`` found them: the next draws repeat."""
        shared, seeded = snap
        for dev, state in shared.items():
            if dev in self._shared:
                self._shared[dev].set_state(state)
        for key, state in seeded.items():
            if state is None:
                self._seeded.pop(key, None)
            elif key in self._seeded:
                self._seeded[key].set_state(state)

    def __call__(self, logits: torch.Tensor, rows: list[SampleRow]) -> SamplerOutput:
        """Sample ``logits [len(rows), vocab]`` (any float dtype); one device->host copy."""
        return self.unpack(self.sample_on_device(logits, rows).tolist(), rows)

    def sample_on_device(self, logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
        """Everything up to the host copy, queued without a host sync: a 1-D tensor of the n
        sampled ids, then, for the rows that ask for logprobs (w of them, largest k kmax),
        their sampled logprobs [w], those tokens' ranks [w], top ids [w * kmax] and top
        logprobs [w * kmax]; float64 when any row asks for logprobs, else int64. ``unpack``
        reads its ``tolist()``."""
        if logits.dim() != 2 or logits.shape[0] != len(rows):
            raise ValueError(
                f"logits must be [num_rows={len(rows)}, vocab], got {tuple(logits.shape)}."
            )
        if not logits.is_floating_point():
            raise ValueError(f"logits must be a float tensor, got {logits.dtype}.")
        if all(self._plain_greedy(r) for r in rows):
            return logits.argmax(dim=-1)  # argmax: first (lowest) id on ties
        dev = logits.device
        x = logits.to(torch.float32, copy=True)
        constrained = [i for i, r in enumerate(rows) if r.matcher is not None]
        held: list[int] = []
        if constrained:
            masks = fill_bitmasks([rows[i].matcher for i in constrained], x.shape[1])
            apply_token_bitmask(x, constrained, masks)
            held = [i for i in constrained
                    if len(rows[i].output_token_ids) < rows[i].params.min_tokens]
            if held:
                held_t = to_device(held, torch.long, dev)
                grammar_only = x.index_select(0, held_t)
        apply_bias_and_min_tokens(x, rows)
        if held:  # min_tokens may ban the only tokens the grammar allows: the grammar wins
            now = x.index_select(0, held_t)
            dead = torch.isneginf(now).all(dim=1, keepdim=True)  # [h, 1]
            x.index_copy_(0, held_t, torch.where(dead, grammar_only, now))
        apply_penalties(x, rows)
        greedy = [i for i, r in enumerate(rows) if r.params.sampling_type == SamplingType.GREEDY]
        random = [i for i, r in enumerate(rows) if r.params.sampling_type == SamplingType.RANDOM]
        tokens = torch.empty(len(rows), dtype=torch.long, device=dev)
        if greedy:
            g = to_device(greedy, torch.long, dev)
            tokens.index_copy_(0, g, x.index_select(0, g).argmax(dim=-1))
        processed = None
        if random:
            r_t = to_device(random, torch.long, dev)
            processed = self._filtered(x, [rows[i] for i in random], r_t)
            probs = processed.softmax(dim=-1)  # [nr, V]
            noise = self._exponential_noise([rows[i] for i in random], x.shape[1], dev)
            tokens.index_copy_(0, r_t, (probs / noise).argmax(dim=-1))
        return self._pack(logits, x, processed, random, tokens, rows)

    @staticmethod
    def chainable(row: SampleRow) -> bool:
        """The row's next token can be sampled before its current one is known on the host
        (decode run-ahead): nothing reads the output so far (penalties, min_tokens still
        pending, logprobs, bias). A run-ahead step that gets dropped gives its generators'
        draws back (``snapshot`` / ``restore``)."""
        p = row.params
        return (
            row.matcher is None  # its mask needs the previous token consumed
            and p.logprobs is None
            and not p.logit_bias
            and p.repetition_penalty == 1.0
            and p.frequency_penalty == 0.0
            and p.presence_penalty == 0.0
            and len(row.output_token_ids) >= p.min_tokens
        )

    @staticmethod
    def _plain_greedy(row: SampleRow) -> bool:
        p = row.params
        return (
            row.matcher is None
            and p.sampling_type == SamplingType.GREEDY
            and p.logprobs is None
            and not p.logit_bias
            and not p.allowed_token_ids
            and p.repetition_penalty == 1.0
            and p.frequency_penalty == 0.0
            and p.presence_penalty == 0.0
            and not (
                len(row.output_token_ids) < p.min_tokens
                and (p.all_stop_token_ids or p.stop_token_ids or p.eos_token_ids)
            )
        )

    @staticmethod
    def _filtered(x: torch.Tensor, rows: list[SampleRow], idx: torch.Tensor) -> torch.Tensor:
        """Temperature-scaled, top-k/top-p/min-p filtered logits of rows ``idx``: [nr, V]."""
        temps = [r.params.temperature for r in rows]
        sub = x.index_select(0, idx) / to_device(temps, x.dtype, x.device).unsqueeze(1)
        apply_top_k_top_p_min_p(
            sub,
            [r.params.top_k for r in rows],
            [r.params.top_p for r in rows],
            [r.params.min_p for r in rows],
        )
        return sub

    def _generator(self, row: SampleRow, device: torch.device) -> torch.Generator:
        if row.params.seed is None:
            gen = self._shared.get(device)
            if gen is None:
                gen = torch.Generator(device=device).manual_seed(self.seed & _U64)
                self._shared[device] = gen
            return gen
        gen = self._seeded.get(row.generator_key)
        if gen is None:
            gen = torch.Generator(device=device)
            gen.manual_seed(choice_seed(row.params.seed, row.choice_index))
            self._seeded[row.generator_key] = gen
        return gen

    def _exponential_noise(
        self, rows: list[SampleRow], vocab: int, device: torch.device
    ) -> torch.Tensor:
        """Exponential(1) noise ``[len(rows), V]`` as -log(U), U ~ U[0, 1) (> 0, never 0).

        -log(U) instead of ``exponential_``: same law, ~5x faster on CPU. Unseeded rows take one
        block from the shared generator; each seeded row takes V draws from its own.
        """
        unseeded = [i for i, r in enumerate(rows) if r.params.seed is None]
        if len(unseeded) == len(rows):
            gen = self._generator(rows[0], device)
            return torch.rand(len(rows), vocab, generator=gen, device=device).log_().neg_()
        noise = torch.empty(len(rows), vocab, dtype=torch.float32, device=device)
        if unseeded:
            gen = self._generator(rows[unseeded[0]], device)
            noise.index_copy_(0, to_device(unseeded, torch.long, device),
                              torch.rand(len(unseeded), vocab, generator=gen, device=device))
        for i, row in enumerate(rows):
            if row.params.seed is not None:
                gen = self._generator(row, device)
                noise[i] = torch.rand(vocab, generator=gen, device=device)
        return noise.log_().neg_()

    def _pack(
        self,
        logits: torch.Tensor,
        x: torch.Tensor,
        processed: torch.Tensor | None,
        random: list[int],
        tokens: torch.Tensor,
        rows: list[SampleRow],
    ) -> torch.Tensor:
        """Tokens and the asked-for logprobs in one tensor (see ``sample_on_device``)."""
        want = [i for i, r in enumerate(rows) if r.params.logprobs is not None]
        if not want:
            return tokens
        dev = x.device
        want_t = to_device(want, torch.long, dev)
        if self.logprobs_mode == "raw_logprobs":
            src = logits.index_select(0, want_t).float()
        elif self.logprobs_mode == "penalized_logprobs" or processed is None:
            src = x.index_select(0, want_t)
        else:
            full = x.clone()
            full.index_copy_(0, to_device(random, torch.long, dev), processed)
            src = full.index_select(0, want_t)
        lp = src.log_softmax(dim=-1)  # [W, V]
        chosen = tokens.index_select(0, want_t)
        sampled = lp.gather(1, chosen.unsqueeze(1))  # [W, 1]
        rank = (lp > sampled).sum(dim=1) + 1  # [W]: 1 for the most likely token
        kmax = max(rows[i].params.logprobs for i in want)
        parts = [tokens.double(), sampled.double().flatten(), rank.double()]
        if kmax > 0:
            top = lp.topk(kmax, dim=-1)  # [W, kmax] each
            parts += [top.indices.double().flatten(), top.values.double().flatten()]
        return torch.cat(parts)

    @staticmethod
    def unpack(flat: list, rows: list[SampleRow]) -> SamplerOutput:
        """``SamplerOutput`` from ``sample_on_device(...).tolist()``."""
        n = len(rows)
        ids = [int(t) for t in flat[:n]]
        want = [i for i, r in enumerate(rows) if r.params.logprobs is not None]
        if not want:
            return SamplerOutput(ids, [None] * n, [None] * n)
        w = len(want)
        kmax = max(rows[i].params.logprobs for i in want)
        ranks = flat[n + w : n + 2 * w]
        top_ids, top_vals = flat[n + 2 * w : n + 2 * w + w * kmax], flat[n + 2 * w + w * kmax :]
        logprobs: list[dict[int, Logprob] | None] = [None] * n
        sampled_lp: list[float | None] = [None] * n
        for j, i in enumerate(want):
            entry = {ids[i]: Logprob(flat[n + j], int(ranks[j]))}
            for c in range(rows[i].params.logprobs):
                entry.setdefault(int(top_ids[j * kmax + c]), Logprob(top_vals[j * kmax + c], c + 1))
            logprobs[i] = entry
            sampled_lp[i] = flat[n + j]
        return SamplerOutput(ids, logprobs, sampled_lp)


def compute_prompt_logprobs(
    logits: torch.Tensor, target_ids: torch.Tensor | list[int], k: int
) -> list[dict[int, float]]:
    """Logprobs of a prompt: ``logits [T, V]`` at position t predict ``target_ids[t]``.

    Returns per position ``{target: Logprob}`` (with its rank) followed by the top ``k`` (raw
    log-softmax, no penalties or temperature). One device->host copy.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [T, vocab], got {tuple(logits.shape)}.")
    targets = torch.as_tensor(target_ids, dtype=torch.long, device=logits.device).flatten()
    if targets.numel() != logits.shape[0]:
        raise ValueError(
            f"target_ids must hold one id per logits row ({logits.shape[0]}), "
            f"got {targets.numel()}."
        )
    if not 0 <= k <= logits.shape[1]:
        raise ValueError(f"k (prompt_logprobs) must be in [0, {logits.shape[1]}], got {k}.")
    num = targets.numel()
    if num == 0:
        return []
    if int(targets.min()) < 0 or int(targets.max()) >= logits.shape[1]:
        raise ValueError(f"target_ids must be token ids in [0, {logits.shape[1]}).")
    lp = logits.float().log_softmax(dim=-1)  # [T, V]
    target_lp = lp.gather(1, targets.unsqueeze(1))  # [T, 1]
    rank = (lp > target_lp).sum(dim=1) + 1
    parts = [targets.double(), target_lp.double().flatten(), rank.double()]
    if k > 0:
        top = lp.topk(k, dim=-1)  # [T, k]
        parts += [top.indices.double().flatten(), top.values.double().flatten()]
    flat = torch.cat(parts).tolist()
    out: list[dict[int, Logprob]] = []
    base_i, base_v = 3 * num, 3 * num + num * k
    for t in range(num):
        entry = {int(flat[t]): Logprob(flat[num + t], int(flat[2 * num + t]))}
        for c in range(k):
            entry.setdefault(int(flat[base_i + t * k + c]), Logprob(flat[base_v + t * k + c],
                                                                     c + 1))
        out.append(entry)
    return out
