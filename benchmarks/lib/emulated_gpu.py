"""An emulated GPU for the engine: the model's forward replaced by a modelled step time.

``emulate(engine, gpu)`` swaps the runner's launch / execute / run-ahead methods of a real
``LLMEngine`` (any model, on the CPU) for ``EmulatedGPU``: a launch queues a step of

    base + per_row * decode rows + per_token * prefill tokens   (ms)

after the steps already queued (a stream: it starts when launched or when the GPU frees up,
whichever is later), and collecting it sleeps without the GIL until it is done. A step of
more than ``graph_tokens`` tokens has no CUDA graph: its launch spins ``eager_ms`` holding
the GIL (Python launching every kernel) and it takes at least that long on the GPU. A
decode step's launch builds the host tensors a graph replay copies in, as the runner does.
Every sampled row gets a word token. Everything else (scheduler, async output processing,
run-ahead, detokenizing, the server) is the real code, so its host time is measured against
a GPU that never waits for anything but the host (``busy``, ``idle`` by launch kind).
"""

from __future__ import annotations

import time


class EmulatedGPU:
    """A stream of steps that take modelled time; ``busy`` sums the queued step times."""

    def __init__(self, base_ms: float, per_row_ms: float, per_token_ms: float,
                 eager_ms: float = 0.0, graph_tokens: int = 512) -> None:
        self.base, self.per_row = base_ms / 1e3, per_row_ms / 1e3
        self.per_token = per_token_ms / 1e3
        # a step of more than graph_tokens new tokens runs eagerly: eager_ms of host time
        # launching it, and at least that long on the GPU
        self.eager, self.graph_tokens = eager_ms / 1e3, graph_tokens
        self.free_at = 0.0
        self.busy = 0.0
        self.steps = 0
        self.idle: dict[str, float] = {}  # seconds the GPU waited for a launch, by its kind
        self.launches: dict[str, int] = {}

    def queue(self, rows, kind: str, launched: float) -> float:
        """Queue the forward of ``rows`` (ScheduledSeq) whose launch began at ``launched``
        (its kernels start then, or when the GPU is free); the time it is done."""
        decode = sum(1 for s in rows if s.num_scheduled_tokens == 1)
        prefill = sum(s.num_scheduled_tokens for s in rows) - decode
        cost = self.base + self.per_row * decode + self.per_token * prefill
        if decode + prefill > self.graph_tokens:
            cost = max(cost, self.eager)
        kind += " + prefill" if prefill else ""
        self.launches[kind] = self.launches.get(kind, 0) + 1
        if self.free_at and launched > self.free_at:
            self.idle[kind] = self.idle.get(kind, 0.0) + launched - self.free_at
        self.free_at = max(launched, self.free_at) + cost
        self.busy += cost
        self.steps += 1
        return self.free_at


class EmulatedStep:
    """PendingStep's API: ``collect()`` sleeps (without the GIL, as a CUDA event wait does)
    until the emulated GPU has run the step."""

    def __init__(self, out, done_at: float) -> None:
        self.out, self.done_at = out, done_at

    def wait(self) -> None:
        delay = self.done_at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)

    def collect(self):
        self.wait()
        return self.out


def emulate(engine, gpu: EmulatedGPU, run_ahead: bool) -> None:
    """Replace ``engine``'s forward by ``gpu``; the rest of the engine runs as it does (with
    decode run-ahead if ``run_ahead``: a step launched before its predecessor's tokens are
    read, as on a GPU)."""
    from edge_llm.engine import cuda_graphs
    from edge_llm.engine.runner import RunnerOutput

    runner = engine.runner
    ladder = cuda_graphs.capture_sizes(256)
    # tokens that decode to whole words, so that every token brings text to its stream
    words = [i for i in range(1000, 3000)
             if engine.tokenizer.decode([i]).strip().isalpha()][:256]

    def forward(rows, kind):
        out = RunnerOutput()
        launched = time.perf_counter()
        tokens = sum(s.num_scheduled_tokens for s in rows)
        if rows and tokens == len(rows) and len(rows) <= ladder[-1]:
            # the host work of a decode graph's replay: its input tensors
            pad = cuda_graphs.padded_size(ladder, len(rows)) or len(rows)
            cuda_graphs.decode_inputs(rows, pad, runner.block_size)
        elif tokens > gpu.graph_tokens:  # an eager forward: Python launching every kernel
            end = time.perf_counter() + gpu.eager
            while time.perf_counter() < end:  # holds the GIL, as launching does
                pass
        for s in rows:
            if s.do_sample:
                out.sampled[s.seq.seq_id] = words[(s.seq.seq_id + len(s.seq.output_token_ids))
                                                  % len(words)]
        step = EmulatedStep(out, gpu.queue(rows, kind, launched) if rows else time.perf_counter())
        step.rows = {s.seq.seq_id: i for i, s in enumerate(rows)}
        return step

    def launch(sched):
        for seq_id in sched.finished_seq_ids:
            runner.sampler.forget(seq_id)
        return forward(sched.scheduled, "launch")

    def chain_index(sched, pending):  # every sampled row of a plain decode step chains
        index = [pending.rows.get(s.seq.seq_id, -1) for s in sched.scheduled]
        return None if -1 in index else index

    def adopt(sched, step):
        for seq_id in sched.finished_seq_ids:
            runner.sampler.forget(seq_id)
        return step

    runner.launch = launch
    runner.execute = lambda sched: launch(sched).collect()
    runner.chain_index = chain_index
    runner.launch_ahead = lambda rows, index, pending: forward(rows, "ahead")
    runner.adopt = adopt
    runner.drop = lambda step: None
    engine.set_loop(async_output=True, run_ahead=run_ahead)
