"""LLMEngine: the synchronous core. ``step()`` runs one of three loops, chosen once at
construction (``set_loop``; vLLM's ``step_fn``, mini-sglang's normal / overlap loops):

- plain (``_step_plain``): schedule, run, postprocess.
- async output processing (``_step_async``; on by default on a GPU: vLLM's "async output
  processing", ``--disable-async-output-proc`` turns it off): collect the step in flight and
  update the scheduler with its tokens, schedule and launch the next step, then build the
  collected step's outputs (detokenizing, stop strings, RequestOutput objects) while the GPU
  runs the next one. A stop string found there finishes its sequence one step late: the token
  the next step samples for it is dropped (the scheduler skips rows of finished sequences).
- decode run-ahead (``_step_run_ahead``; on by default with async outputs on a GPU; vLLM's
  "async scheduling"): as async output processing, and a decode step in flight gets its
  successor launched before the wait, fed with the tokens it samples on the device
  (engine/scheduler_ahead.py): the GPU no longer idles while the host reads a step's tokens,
  updates the scheduler and schedules the next one. A step with a row whose sampling reads
  the tokens so far (a constraint, penalties, logprobs: ``Sampler.chainable``) keeps the
  async order.

Also owns request admission (tokenization, validation) and turning sampled tokens into
``RequestOutput`` objects (detokenization, stop strings, logprobs, finish reasons).
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from edge_llm import envs
from edge_llm.config import EngineConfig
from edge_llm.model.loader import load_model, resolve_device
from edge_llm.model.weights import resolve_model_path
from edge_llm.outputs import CompletionOutput, RequestMetrics, RequestOutput
from edge_llm.sampling_params import SamplingParams

from .cpu_threads import set_cpu_threads
from .detokenizer import IncrementalDetokenizer
from .kv_cache import use_expandable_segments
from .pending_step import PendingStep, RunnerOutput
from .request_state import Choice, RequestState, TokenNames, checked_request, finish_reason
from .runner import ModelRunner
from .scheduler import Scheduler
from .scheduler_ahead import ahead_matches, plan_ahead
from .scheduler_output import ScheduledSeq, SchedulerOutput
from .sequence import Sequence, SequenceStatus
from .structured_output import GrammarCompiler
from .tokenizer import eos_token_ids, load_tokenizer
from .tokenizer_files import check_tokenizer_files

logger = logging.getLogger(__name__)
PromptInput = str | list[int] | dict
T = TypeVar("T")
# a collected step: what it ran, the sequences it advanced, what it sampled
FinishedStep = tuple[SchedulerOutput, list[Sequence], RunnerOutput]
# a run-ahead step: its rows (scheduler_ahead.plan_ahead) and its launch
AheadStep = tuple[list[ScheduledSeq], PendingStep]


class StepError(RuntimeError):
    """A step raised; its requests were aborted (blocks freed) and are named in ``ids``.
    ``outputs``: outputs of the step before it, when they were still due (async output
    processing), to deliver as usual."""

    def __init__(self, ids: set[str], cause: BaseException,
                 outputs: list[RequestOutput] | None = None) -> None:
        super().__init__(f"step failed for {len(ids)} requests: {cause!r}")
        self.ids = ids
        self.cause = cause
        self.outputs = outputs or []


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        mc = config.model
        model = mc.model
        self.demo_build_seconds = 0.0  # the demo model's first-start build (start-up phases)
        if model is None:
            from edge_llm.model.demo import prepare_demo_model

            began = time.perf_counter()
            folder, built = prepare_demo_model()
            model = str(folder)
            if built:
                self.demo_build_seconds = time.perf_counter() - began
        device = resolve_device(mc.device)
        if use_expandable_segments(device):  # before any CUDA memory
            logger.info("CUDA allocator: expandable segments (%s=expandable_segments:False "
                        "keeps the default)", envs.PYTORCH_CUDA_ALLOC_CONF.name)
        if device.type == "cpu":
            set_cpu_threads()  # before the load: the CPU unpacking runs on them too
        self.loaded = self._load(model)
        arch = self.loaded.arch
        self.max_model_len = self._resolve_max_model_len()
        self.config = config = replace(config, scheduler=replace(
            config.scheduler, max_model_len=self.max_model_len))
        # after the weights, not beside them: on a thread its imports hold the GIL against the
        # loader's many small GPU ops and slow the weight load down
        self.tokenizer = load_tokenizer(self.loaded.path, mc.chat_template)
        gen_file = self.loaded.path / "generation_config.json"
        gen = json.loads(gen_file.read_text()) if gen_file.is_file() else {}
        self.eos_token_ids = eos_token_ids(self.tokenizer, arch.eos_token_ids, gen)
        self.token_names = TokenNames(self.tokenizer)  # Logprob.decoded_token
        self.grammars = GrammarCompiler(self.tokenizer, arch.vocab_size, self.eos_token_ids)
        self.model_name = _model_name(model, mc.model is None)
        self.runner = ModelRunner(self.loaded, config.cache, config.scheduler, seed=mc.seed,
                                  enforce_eager=config.enforce_eager,
                                  graph_sizes=config.cuda_graph_sizes)
        if config.scheduler.max_tokens_with_decodes == "auto":
            self.config = config = replace(config, scheduler=replace(
                config.scheduler, max_tokens_with_decodes=self.runner.short_step_tokens()))
            if config.scheduler.max_tokens_with_decodes is not None:
                logger.info("Steps with running decodes take at most %d tokens (the largest "
                            "short-step CUDA graph)", config.scheduler.max_tokens_with_decodes)
        self.scheduler = Scheduler(
            config.scheduler, config.cache, self.runner.plan.num_gpu_blocks,
            self.runner.plan.num_cpu_blocks,
        )
        self.requests: dict[str, RequestState] = {}
        on_gpu = self.runner.device.type == "cuda"
        self._in_flight: tuple[SchedulerOutput, PendingStep] | None = None  # launched last
        async_output = on_gpu if config.async_output_proc is None else config.async_output_proc
        self.set_loop(async_output, async_output and (
            on_gpu if config.decode_run_ahead is None else config.decode_run_ahead))
        self.ahead_steps = Counter()  # run-ahead steps: "adopted" / "dropped"
        self.sleep_level = self.prompt_tokens_total = self.generation_tokens_total = 0

    def _load(self, model: str, progress: bool = True):
        mc = self.config.model
        path = resolve_model_path(model, mc.revision)
        check_tokenizer_files(path)  # the tokenizer loads after the weights: refuse first
        # RoPE tables for the context asked for (LongRoPE picks its factors by it; see
        # model/layers.py); None: the model's whole context
        return load_model(str(path), revision=mc.revision, dtype=mc.dtype, device=mc.device,
                          progress=progress, max_positions=mc.max_model_len)

    def _resolve_max_model_len(self) -> int:
        arch = self.loaded.arch
        # sliding-window layers attend to their window at any length (the attention kernels
        # mask and skip the keys before it), so the model's context is the limit
        limit = arch.max_position_embeddings
        asked = self.config.model.max_model_len
        if asked is not None and asked > limit:
            raise ValueError(
                f"max_model_len={asked} exceeds the model's context length {limit}."
            )
        return asked or limit

    # ---- admission -------------------------------------------------------------------------
    def tokenize(self, prompt: PromptInput) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            prompt = prompt["prompt"]
        if isinstance(prompt, str):
            # a rendered chat template already starts with BOS: don't add a second one
            bos = self.tokenizer.bos_token
            add = not (bos and prompt.startswith(bos))
            return prompt, self.tokenizer.encode(prompt, add_special_tokens=add)
        return None, list(prompt)

    def add_request(
        self, request_id: str, prompt: PromptInput, params: SamplingParams,
        arrival_time: float | None = None, final_only: bool = False,
    ) -> None:
        """Validate and queue; a bad prompt raises ValueError and leaves nothing behind.

        ``final_only`` (vLLM's ``RequestOutputKind.FINAL_ONLY``, what ``LLM.generate`` uses):
        ``step()`` returns no output for this request until it finishes. Building a
        RequestOutput copies every token so far, for every running request, every step: about
        half of the output processing of a large batch.
        """
        if self.is_sleeping:
            raise RuntimeError("The engine is asleep: call wake_up() first.")
        if request_id in self.requests:
            raise ValueError(f"Request id {request_id!r} is already in use.")
        text, ids = self.tokenize(prompt)
        ids = checked_request(ids, params, self.loaded.arch.vocab_size, self.max_model_len)
        params = params.clone()
        params.eos_token_ids = set(self.eos_token_ids)
        if not params.ignore_eos:
            params.all_stop_token_ids |= self.eos_token_ids
        spec = params.structured_outputs
        grammar = None if spec is None else self.grammars.compile(spec)  # ValueError: refused
        arrival = arrival_time or time.time()
        seqs = self.scheduler.add_request(request_id, ids, params, arrival)
        if grammar is not None:  # n > 1 siblings forked later copy the first one's matcher
            for seq in seqs:
                seq.matcher = grammar.matcher()
        req = RequestState(request_id, text, ids, params, RequestMetrics(arrival_time=arrival),
                       final_only=final_only)
        if params.prompt_logprobs is not None:
            req.prompt_logprobs = [None]  # the first prompt token has none (also if it is alone)
        self.requests[request_id] = req
        self.prompt_tokens_total += len(ids)

    def abort(self, request_id: str) -> None:
        if self.requests.pop(request_id, None) is not None:
            self.scheduler.abort(request_id)  # the runner forgets its seeds via finished_seq_ids

    def has_unfinished(self) -> bool:
        return self._in_flight is not None or self.scheduler.has_unfinished()

    # ---- the loop, chosen once ------------------------------------------------------------
    @property
    def async_output(self) -> bool:
        """Async output processing: a step's outputs are built while the next step runs."""
        return self._loop is not LLMEngine._step_plain

    @property
    def run_ahead(self) -> bool:
        """Decode run-ahead (with async outputs): see engine/scheduler_ahead.py."""
        return self._loop is LLMEngine._step_run_ahead

    def set_loop(self, async_output: bool, run_ahead: bool = False) -> None:
        """Choose what ``step()`` runs: the plain loop, async output processing, or async
        output processing with decode run-ahead (``run_ahead`` needs ``async_output``).
        Construction chooses from the config; a caller may choose again while no step is in
        flight (tests and benchmarks compare the loops on one loaded engine)."""
        if run_ahead and not async_output:
            raise ValueError("Decode run-ahead needs async output processing.")
        if self._in_flight is not None:
            raise RuntimeError("Cannot change the engine loop while a step is in flight.")
        # the function, not a bound method: one held by its own object is a reference cycle,
        # which would keep a dropped engine (and its device memory) until a GC pass
        self._loop: Callable[[LLMEngine], list[RequestOutput]] = (
            LLMEngine._step_run_ahead if run_ahead
            else LLMEngine._step_async if async_output else LLMEngine._step_plain)

    def step(self) -> list[RequestOutput]:
        """One iteration of the loop chosen by ``set_loop``: the outputs of the step that
        finished. A failed step raises StepError after aborting its requests."""
        return self._loop(self)

    def _step_plain(self) -> list[RequestOutput]:
        """Schedule, run, postprocess."""
        sched = self.scheduler.schedule()
        result = self._run(sched, lambda: self.runner.execute(sched))
        seqs = self.scheduler.update_from_output(sched, result.sampled)
        return self._postprocess(sched, seqs, result)

    def _step_async(self) -> list[RequestOutput]:
        """Collect the step in flight and update the scheduler with its tokens, schedule and
        launch the next step, then build the collected step's outputs while it runs."""
        done = None
        if self._in_flight is not None:
            done = self._collect(*self._take_in_flight())
        nxt = self.scheduler.schedule()
        return self._launch_then_postprocess(done, lambda: self._launch(nxt))

    def _step_run_ahead(self) -> list[RequestOutput]:
        """``_step_async`` with the successor of a decode step in flight launched before the
        wait, fed on the device with the tokens that step samples; once the next step is
        scheduled it is adopted if it is that step, else dropped (scheduler_ahead.py)."""
        done = ahead = None
        if self._in_flight is not None:
            sched, pending = self._take_in_flight()
            ahead = self._launch_ahead(sched, pending)
            done = self._collect(sched, pending)
        nxt = self.scheduler.schedule()
        return self._launch_then_postprocess(done, lambda: self._adopt_or_launch(nxt, ahead))

    def _take_in_flight(self) -> tuple[SchedulerOutput, PendingStep]:
        in_flight, self._in_flight = self._in_flight, None
        return in_flight

    def _collect(self, sched: SchedulerOutput, pending: PendingStep) -> FinishedStep:
        """Wait for ``pending`` (launched for ``sched``) and update the scheduler."""
        result = self._run(sched, pending.collect)
        return sched, self.scheduler.update_from_output(sched, result.sampled), result

    def _launch_then_postprocess(self, done: FinishedStep | None,
                                 launch: Callable[[], None]) -> list[RequestOutput]:
        """``launch()``, then the outputs of ``done``; those are still due when the launch
        fails, so its StepError carries them."""
        try:
            launch()
        except StepError as err:
            err.outputs = self._postprocess(*done) if done else []
            raise
        return self._postprocess(*done) if done else []

    def _launch(self, nxt: SchedulerOutput) -> None:
        """Launch ``nxt``; the next ``step()`` collects it. A step without rows (swaps,
        copies, forgotten seeds at most) runs now: there is nothing to wait for."""
        if nxt.scheduled:
            self._in_flight = (nxt, self._run(nxt, lambda: self.runner.launch(nxt)))
        else:
            self._run(nxt, lambda: self.runner.execute(nxt))
            self.scheduler.update_from_output(nxt, {})

    def _adopt_or_launch(self, nxt: SchedulerOutput, ahead: AheadStep | None) -> None:
        """The run-ahead step as ``nxt``'s launch when it is that step (``ahead_matches``),
        else dropped (it only cost device time) and ``nxt`` launched."""
        if ahead is not None:
            rows, step = ahead
            if ahead_matches(rows, nxt):
                self.ahead_steps["adopted"] += 1
                self._in_flight = (nxt, self._run(nxt, lambda: self.runner.adopt(nxt, step)))
                return
            self.ahead_steps["dropped"] += 1
            self.runner.drop(step)
        self._launch(nxt)

    def _launch_ahead(self, sched: SchedulerOutput, pending: PendingStep) -> AheadStep | None:
        """The decode step after ``sched``, launched now; None when it cannot be planned yet
        (scheduler_ahead.plan_ahead) or a row's sampling rules out chaining (constrained and
        penalized rows: ``ModelRunner.chain_index``). A failure here is the in-flight step's
        (its requests abort)."""
        tokens_at = self.runner.chain_index(sched, pending)
        plan = None if tokens_at is None else plan_ahead(self.scheduler, sched)
        if plan is None:
            return None
        rows, index = plan
        index = [tokens_at[i] for i in index]
        return rows, self._run(sched, lambda: self.runner.launch_ahead(rows, index, pending))

    def _run(self, sched: SchedulerOutput, fn: Callable[[], T]) -> T:
        """``fn()``; on an exception, abort the step's requests and raise StepError."""
        try:
            return fn()
        except Exception as exc:
            ids = {s.seq.request_id for s in sched.scheduled}
            for rid in ids:
                self.abort(rid)
            raise StepError(ids, exc) from exc

    def _record_prompt_logprobs(self, sched: SchedulerOutput, result: RunnerOutput) -> None:
        """Position p holds the logprob of prompt token p (p = 0 has none, as in vLLM); a
        recomputed prefill reports positions already recorded, which are skipped."""
        if not result.prompt_logprobs:
            return
        rows = {s.seq.seq_id: s.seq for s in sched.scheduled}
        for seq_id, (first, lps) in result.prompt_logprobs.items():
            req = self.requests.get(rows[seq_id].request_id)
            if req is None:
                continue
            for pos, lp in enumerate(lps, start=first):  # [None] at first (add_request)
                if pos == len(req.prompt_logprobs):
                    req.prompt_logprobs.append(self.token_names(lp))

    def _postprocess(
        self, sched: SchedulerOutput, seqs: list[Sequence], result: RunnerOutput
    ) -> list[RequestOutput]:
        now = time.time()
        touched: dict[str, RequestState] = {}
        self._record_prompt_logprobs(sched, result)
        for seq in seqs:
            req = self.requests.get(seq.request_id)
            if req is None:
                continue
            touched[req.request_id] = req
            self._advance(req, seq, result, now)
        outputs = []
        for req in touched.values():
            finished = len(req.choices) == req.params.n and all(
                c.done for c in req.choices.values()
            )
            if req.final_only and not finished:
                continue
            outputs.append(self._make_output(req, finished))
            if finished:
                req.metrics.finished_time = now
                del self.requests[req.request_id]
        return outputs

    def _advance(self, req: RequestState, seq: Sequence, result: RunnerOutput, now: float) -> None:
        choice = req.choices.get(seq.index)
        if choice is None:
            detok = IncrementalDetokenizer(self.tokenizer, req.prompt_token_ids, req.params)
            choice = Choice(detok, CompletionOutput(index=seq.index, text="", token_ids=[]))
            choice.out.cumulative_logprob = 0.0 if req.params.logprobs is not None else None
            if req.params.logprobs is not None:
                choice.out.logprobs = []
            req.choices[seq.index] = choice
            req.num_cached_tokens = max(req.num_cached_tokens, seq.num_cached_tokens)
        if req.metrics.first_token_time is None:
            req.metrics.first_token_time = now
        req.metrics.last_token_time = now
        if seq.num_preemptions > req.metrics.num_preemptions:  # its most preempted choice
            req.metrics.num_preemptions = seq.num_preemptions
        token = seq.output_token_ids[-1]
        out = choice.out
        self.generation_tokens_total += 1
        out.token_ids.append(token)
        out.token_ids_delta.append(token)
        stopped_by_token = (
            seq.status == SequenceStatus.FINISHED_STOPPED and token in seq.stop_token_ids
        )
        detok = req.params.detokenize  # False: token ids only, no text (as vLLM)
        delta = choice.detok.add([token], stop_terminated=stopped_by_token) if detok else ""
        if req.params.logprobs is not None:
            lp = self.token_names(result.logprobs.get(seq.seq_id) or {})
            out.logprobs.append(lp)
            out.logprobs_delta = (out.logprobs_delta or []) + [lp]
            out.cumulative_logprob += result.sampled_logprobs.get(seq.seq_id, 0.0)
        if choice.detok.finished and not seq.status.is_finished:
            self.scheduler.finish(seq, SequenceStatus.FINISHED_STOPPED, choice.detok.stop_reason)
        elif choice.detok.finished and seq.status == SequenceStatus.FINISHED_LENGTH:
            # with the last allowed token: a stop, as vLLM reports it
            seq.status, seq.stop_reason = SequenceStatus.FINISHED_STOPPED, choice.detok.stop_reason
        if seq.status.is_finished:
            delta += choice.detok.flush() if detok else ""
            choice.done = True
            out.finish_reason, out.stop_reason = finish_reason(seq)
        out.text = choice.detok.text
        out.text_delta += delta

    def _make_output(self, req: RequestState, finished: bool) -> RequestOutput:
        outs = []
        for i in sorted(req.choices):
            c = req.choices[i].out
            outs.append(c.snapshot())
            c.text_delta, c.token_ids_delta, c.logprobs_delta = "", [], None
        return RequestOutput(
            request_id=req.request_id, prompt=req.prompt,
            prompt_token_ids=req.prompt_token_ids, outputs=outs, finished=finished,
            prompt_logprobs=req.prompt_logprobs, metrics=req.metrics,
            num_cached_tokens=req.num_cached_tokens,
        )

    # ---- scale to zero ---------------------------------------------------------------------
    @property
    def is_sleeping(self) -> bool:
        return self.sleep_level > 0

    def sleep(self, level: int = 1) -> None:
        """Free the KV cache (and the prefix cache with it); level 1 keeps the weights in host
        memory, level 2 drops them. Refused while requests are in flight."""
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level}.")
        if self.has_unfinished():
            n = self.scheduler.num_unfinished_requests
            raise ValueError(f"Cannot sleep with {n} requests in flight." if n else
                             "Cannot sleep while a step is in flight: step() until "
                             "has_unfinished() is False.")
        if self.is_sleeping:
            return
        self.runner.sleep(level)
        self.sleep_level = level

    def wake_up(self) -> None:
        if not self.is_sleeping:
            return
        path = str(self.loaded.path)
        self.runner.wake_up(lambda: self._load(path, progress=False))
        self.scheduler = Scheduler(
            self.config.scheduler, self.config.cache, self.runner.plan.num_gpu_blocks,
            self.runner.plan.num_cpu_blocks,
        )
        self.sleep_level = 0

    def check_integrity(self) -> None:
        self.scheduler.check_integrity()

    def stats(self) -> dict:
        """Scheduler counters, token totals, and the CUDA graphs' last capture: decode graph
        count, short-step (prefill) graph count, and seconds and device
        bytes of both together (zeros when eager or asleep). ``forward_steps``: forwards
        launched so far by path ("decode_graph", "short_graph", "eager"; run-ahead steps
        included). ``cache_config``: the KV cache's settings as strings (vLLM's
        ``cache_config_info`` labels). ``sleep_level``: 0 awake, else the level it sleeps at.
        ``startup``: seconds of the demo build, weight load and kernel warm-up, weight bytes,
        the device type."""
        s = self.scheduler.stats()
        graphs, prefill = self.runner.graph_stats, self.runner.prefill_graph_stats
        s.update(num_total_blocks=self.scheduler.pool.num_blocks, sleep_level=self.sleep_level,
                 prompt_tokens_total=self.prompt_tokens_total,
                 generation_tokens_total=self.generation_tokens_total,
                 num_cuda_graphs=len(graphs.sizes),
                 num_prefill_cuda_graphs=len(prefill.sizes),
                 cuda_graph_capture_seconds=graphs.seconds + prefill.seconds,
                 cuda_graph_memory_bytes=graphs.memory_bytes + prefill.memory_bytes,
                 forward_steps={path: self.runner.step_paths[path]
                                for path in ("decode_graph", "short_graph", "eager")})
        # how construction went, for the start-up log (server/hooks.py StartupPhases)
        s["startup"] = {"demo_build_seconds": self.demo_build_seconds,
                        "weight_load_seconds": self.loaded.load_seconds,
                        "weight_bytes": self.loaded.num_bytes,
                        "kernel_warmup_seconds": self.runner.kernel_warmup_seconds,
                        "device": self.runner.device.type}
        cache, plan = self.config.cache, self.runner.plan
        s["cache_config"] = {
            "block_size": str(cache.block_size), "cache_dtype": cache.kv_cache_dtype,
            "enable_prefix_caching": str(cache.enable_prefix_caching),
            "gpu_memory_utilization": str(cache.gpu_memory_utilization),
            "num_gpu_blocks": str(plan.num_gpu_blocks), "num_cpu_blocks": str(plan.num_cpu_blocks),
            "swap_space": str(cache.swap_space),
        }
        return s


def _model_name(model: str, demo: bool) -> str:
    if demo:
        return "SmolLM2-135M-Instruct-AWQ"
    path = Path(model)
    return path.name if path.exists() else model
