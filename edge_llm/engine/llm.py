"""Offline batch API with vLLM's names: ``LLM(model).generate(prompts, params)``."""

from __future__ import annotations

import itertools
from collections.abc import Sequence as Seq
from typing import Any

from tqdm.auto import tqdm

from edge_llm.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from edge_llm.outputs import RequestOutput
from edge_llm.sampling_params import SamplingParams

from .llm_engine import LLMEngine, PromptInput
from .tokenizer import apply_chat_template


class LLM:
    """Offline generation on one in-process engine.

    ``max_num_batched_tokens`` defaults to 8,192 here (the server's default is 2,048), as vLLM's
    offline class does: offline work has no inter-token latency to protect, and larger prefill
    chunks raise its throughput. For the same reason steps with running decodes are not capped here
    by default (``max_tokens_with_decodes``, see SchedulerConfig).
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        dtype: str = "auto",
        device: str = "auto",
        max_model_len: int | None = None,
        block_size: int = 16,
        enable_prefix_caching: bool = True,
        swap_space: float = 4.0,
        gpu_memory_utilization: float = 0.9,
        kv_cache_memory: int | None = None,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 8192,
        growth_reserve: int = 128,
        preemption_mode: str | None = None,
        seed: int = 0,
        revision: str | None = None,
        chat_template: str | None = None,
        enforce_eager: bool = False,
        cuda_graph_sizes: Seq[int] | None = None,
        disable_async_output_proc: bool = False,
        disable_decode_run_ahead: bool = False,
        num_gpu_blocks_override: int | None = None,
        kv_cache_dtype: str = "auto",
        max_tokens_with_decodes: int | str | None = None,
    ) -> None:
        config = EngineConfig(
            model=ModelConfig(model=model, revision=revision, dtype=dtype, device=device,
                              max_model_len=max_model_len, seed=seed,
                              chat_template=chat_template),
            cache=CacheConfig(block_size=block_size, gpu_memory_utilization=gpu_memory_utilization,
                              kv_cache_memory=kv_cache_memory, swap_space=swap_space,
                              enable_prefix_caching=enable_prefix_caching,
                              num_gpu_blocks_override=num_gpu_blocks_override,
                              kv_cache_dtype=kv_cache_dtype),
            scheduler=SchedulerConfig(max_num_seqs=max_num_seqs,
                                      max_num_batched_tokens=max_num_batched_tokens,
                                      growth_reserve=growth_reserve,
                                      preemption_mode=preemption_mode,
                                      max_tokens_with_decodes=max_tokens_with_decodes),
            enforce_eager=enforce_eager,
            cuda_graph_sizes=None if cuda_graph_sizes is None else tuple(cuda_graph_sizes),
            async_output_proc=False if disable_async_output_proc else None,
            decode_run_ahead=False if disable_decode_run_ahead else None,
        )
        self.engine = LLMEngine(config)
        self._ids = itertools.count()

    def get_tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self,
        prompts: PromptInput | Seq[PromptInput],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in the order of the prompts."""
        if isinstance(prompts, (str, dict)) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(
                    f"Got {len(prompts)} prompts but {len(params)} sampling params."
                )
        ids = []
        try:
            for prompt, p in zip(prompts, params, strict=True):
                rid = str(next(self._ids))
                self.engine.add_request(rid, prompt, p, final_only=True)
                ids.append(rid)
        except Exception:
            for rid in ids:
                self.engine.abort(rid)
            raise
        return self._run(ids, use_tqdm)

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        done: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(ids), desc="Processed prompts", disable=not use_tqdm or len(ids) < 2)
        while self.engine.has_unfinished():
            for out in self.engine.step():
                if out.finished:
                    done[out.request_id] = out
                    bar.update(1)
        bar.close()
        return [done[rid] for rid in ids]

    def chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = True,
        add_generation_prompt: bool = True,
        *,
        chat_template: str | None = None,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Chat with one conversation or several, as vLLM's ``LLM.chat``: ``chat_template``
        overrides the tokenizer's, ``continue_final_message`` continues the last (assistant)
        message instead of opening a new turn (``add_generation_prompt`` must then be
        False), ``tools`` and ``chat_template_kwargs`` are passed to the template."""
        if not messages:
            raise ValueError("messages must hold at least one message or conversation.")
        if continue_final_message and add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt cannot both be "
                             "True.")
        conversations = [messages] if isinstance(messages[0], dict) else messages
        extra = dict(chat_template_kwargs or {})
        extra.update(chat_template=chat_template, tools=tools)
        if continue_final_message:
            extra["continue_final_message"] = True
        prompts = []
        for conv in conversations:
            text = apply_chat_template(self.engine.tokenizer, conv, add_generation_prompt,
                                       **extra)
            ids = self.engine.tokenizer.encode(text, add_special_tokens=False)
            prompts.append({"prompt": text, "prompt_token_ids": ids})
        return self.generate(prompts, sampling_params, use_tqdm)
