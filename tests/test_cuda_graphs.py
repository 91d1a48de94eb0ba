"""Decode CUDA graphs, the parts that run anywhere: padded sizes, padded inputs, and the padded
decode forward (``DecodeGraphs.run`` without a captured graph runs it eagerly) against the
plain eager step, on CPU. The captured graphs themselves: tests/test_cuda_graphs_gpu.py.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from edge_llm import LLM, CompletionOutput, SamplingParams
from edge_llm.engine.cuda_graphs import (
    DecodeGraphs,
    GraphStats,
    capture_or_release,
    capture_sizes,
    capture_stats,
    decode_inputs,
    describe_sizes,
    is_decode_step,
    padded_size,
    release_graphs,
)
from tests.helpers import save_hf_checkpoint, tiny_hf_model

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=24)


# ---- helpers shared with the GPU tests ------------------------------------------------------


def word_model(out: Path, vocab: int = 512, logit_scale: float = 1.0, **kw) -> Path:
    """A random tiny Llama with a word-level tokenizer of exactly ``vocab`` ids (no demo
    model, no network: the GPU machine has neither). ``logit_scale`` multiplies lm_head so
    the logits spread like a trained model's (random init leaves near-ties everywhere)."""
    from benchmarks.random_checkpoint import write_tokenizer

    kw = {"hidden": 64, "heads": 4, "kv_heads": 2, "layers": 2, "max_pos": 512, **kw}
    hf = tiny_hf_model("LlamaForCausalLM", vocab=vocab, **kw)
    with torch.no_grad():
        hf.lm_head.weight.mul_(logit_scale)
    save_hf_checkpoint(hf, out)
    write_tokenizer(out, vocab)
    return out


def random_prompts(n: int, vocab: int, lo: int, hi: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def run_traffic(llm: LLM, arrivals: list[tuple[int, list[int]]],
                params: SamplingParams) -> dict[str, CompletionOutput]:
    """Requests arriving at given engine steps (so prefills land among running decodes);
    returns each request's first choice. The same arrivals give the same schedule."""
    engine, done, step = llm.engine, {}, 0
    pending = sorted(arrivals, key=lambda a: a[0])
    i = 0
    while i < len(pending) or engine.has_unfinished():
        while i < len(pending) and pending[i][0] <= step:
            engine.add_request(f"r{i}", {"prompt_token_ids": pending[i][1]}, params)
            i += 1
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0]
        step += 1
    return done


def tokens(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


# ---- pure logic -----------------------------------------------------------------------------


@pytest.mark.parametrize("max_num_seqs, expected", [
    (1, [1]), (2, [1, 2]), (3, [1, 2, 4]), (8, [1, 2, 4, 8]), (9, [1, 2, 4, 8, 16]),
    (32, [1, 2, 4, 8, 16, 24, 32]), (33, [1, 2, 4, 8, 16, 24, 32, 48]),
    (200, [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256]),
])
def test_capture_sizes(max_num_seqs, expected):
    assert capture_sizes(max_num_seqs) == expected


def test_capture_sizes_cap_and_errors():
    sizes = capture_sizes(100_000)
    assert sizes == [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512]
    # beyond 32 rows a padded batch wastes at most a third of its rows
    assert all((b - a) / b <= 1 / 3 for a, b in zip(sizes[6:], sizes[7:], strict=False))
    assert capture_sizes(300, limit=256)[-1] == 256
    with pytest.raises(ValueError, match="max_num_seqs"):
        capture_sizes(0)
    assert describe_sizes(capture_sizes(256)) == "1, 2, 4, 8, 16, ..., 256"
    assert describe_sizes([1, 2, 4]) == "1, 2, 4"


def test_padded_size():
    sizes = [1, 2, 4, 8, 16]
    assert [padded_size(sizes, b) for b in (1, 2, 3, 5, 8, 9, 16, 17)] == [
        1, 2, 4, 8, 8, 16, 16, None]


def _row(tokens_, start, table, prompt_logprobs=None, num_prompt=4):
    params = SimpleNamespace(prompt_logprobs=prompt_logprobs)
    seq = SimpleNamespace(params=params, num_prompt_tokens=num_prompt)
    return SimpleNamespace(seq=seq, token_ids=tokens_, start_pos=start,
                           num_scheduled_tokens=len(tokens_), block_table=table)


def test_decode_inputs_pads_rows():
    bs = 8
    rows = [_row([11], 0, [5]), _row([22], 17, [3, 9, 4]), _row([33], 8, [7, 2])]
    got = decode_inputs(rows, 4, bs)
    assert got.input_ids.tolist() == [11, 22, 33, 0]
    assert got.positions.tolist() == [0, 17, 8, 0]
    # position p lives in block table[p // 8] at offset p % 8; padding: slot -1
    assert got.slot_mapping.tolist() == [5 * 8, 4 * 8 + 1, 2 * 8 + 0, -1]
    assert got.seq_lens.tolist() == [1, 18, 9, 1]
    assert got.block_tables.tolist() == [[5, 0, 0], [3, 9, 4], [7, 2, 0], [0, 0, 0]]
    assert got.seq_lens.dtype == got.block_tables.dtype == torch.int32
    assert got.slot_mapping.dtype == torch.int64
    with pytest.raises(ValueError, match="does not fit"):
        decode_inputs(rows, 2, bs)
    with pytest.raises(ValueError, match="one token"):
        decode_inputs([_row([1, 2], 0, [1])], 1, bs)


def test_is_decode_step():
    assert is_decode_step([_row([1], 5, [1]), _row([2], 9, [2, 3])])
    assert not is_decode_step([])
    assert not is_decode_step([_row([1], 5, [1]), _row([2, 3], 0, [4])])  # a prefill chunk
    # a one-token chunk whose successor is still a prompt token, with prompt logprobs asked
    assert not is_decode_step([_row([1], 1, [1], prompt_logprobs=2, num_prompt=4)])
    assert is_decode_step([_row([1], 3, [1], prompt_logprobs=2, num_prompt=4)])


# ---- the padded forward on CPU --------------------------------------------------------------


@pytest.fixture(scope="module")
def word_dir(tmp_path_factory) -> Path:
    return word_model(tmp_path_factory.mktemp("graphs-cpu"))


def _llm(path: Path, **kw) -> LLM:
    kw = {"device": "cpu", "dtype": "float32", "max_model_len": 256, "block_size": 8,
          "max_num_seqs": 8, "max_num_batched_tokens": 128, "swap_space": 0.0, **kw}
    return LLM(str(path), **kw)


def _attach_padded(llm: LLM, sizes: list[int]) -> DecodeGraphs:
    """Give a CPU runner DecodeGraphs without captured graphs: decode steps then take the
    padded path (the code that feeds the graphs on CUDA) eagerly."""
    runner = llm.engine.runner
    graphs = DecodeGraphs(runner.model, runner.kv.layers, sizes, 256, runner.block_size,
                          runner.device)
    runner.graphs = graphs
    return graphs


def test_cpu_runner_captures_nothing(word_dir):
    llm = _llm(word_dir)
    assert llm.engine.runner.graphs is None
    st = llm.engine.stats()
    assert st["num_cuda_graphs"] == 0 and st["cuda_graph_memory_bytes"] == 0
    assert st["cuda_graph_capture_seconds"] == 0.0


def test_padded_logits_equal_eager_logits(word_dir):
    llm = _llm(word_dir)
    engine, runner = llm.engine, llm.engine.runner
    for i, p in enumerate(random_prompts(3, 512, 5, 30, seed=1)):
        engine.add_request(str(i), {"prompt_token_ids": p}, GREEDY)
    engine.step()  # prefill all three (eager); the next step is decode-only
    sched = engine.scheduler.schedule()
    assert is_decode_step(sched.scheduled) and len(sched.scheduled) == 3
    with torch.inference_mode():
        ids, pos, meta, sample_idx, _ = runner._prepare(sched.scheduled)
        eager = runner.model.compute_logits(runner.model(ids, pos, runner.kv.layers, meta))
        cache_eager = [k.clone() for k, _ in runner.kv.layers]
    graphs = DecodeGraphs(runner.model, runner.kv.layers, [1, 2, 4, 8], 256, 8, runner.device)
    got = graphs.run(sched.scheduled)
    assert got.shape == eager.shape and graphs.replays == {4: 1}
    torch.testing.assert_close(got, eager, rtol=1e-5, atol=1e-5)
    # the real rows wrote the same K/V, the padding row wrote nothing
    for (k, _), before in zip(runner.kv.layers, cache_eager, strict=True):
        torch.testing.assert_close(k, before, rtol=1e-5, atol=1e-5, equal_nan=True)


def test_runner_decode_path_matches_eager_under_mixed_traffic(word_dir):
    """Prompts of different lengths arriving over time: decode steps of varying size take
    the padded path; tokens equal the eager engine's, sequences cross block boundaries."""
    prompts = random_prompts(7, 512, 3, 40, seed=2)
    arrivals = [(3 * i, p) for i, p in enumerate(prompts)]
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=20)
    ref = run_traffic(_llm(word_dir), arrivals, params)
    padded = _llm(word_dir)
    graphs = _attach_padded(padded, [1, 2, 4, 8])
    got = run_traffic(padded, arrivals, params)
    assert {k: c.token_ids for k, c in got.items()} == {k: c.token_ids for k, c in ref.items()}
    assert len(ref) == len(prompts)
    assert len(graphs.replays) >= 3, graphs.replays  # several padded sizes were used
    padded.engine.check_integrity()


def test_runner_padded_path_with_logprobs_and_n(word_dir):
    """Sampling rows that are not plain greedy (logprobs, seeded random, n > 1) read the
    same logits rows through the padded path."""
    prompts = [{"prompt_token_ids": p} for p in random_prompts(3, 512, 4, 20, seed=3)]
    params = SamplingParams(temperature=0.8, seed=7, n=2, max_tokens=10, logprobs=2,
                            ignore_eos=True)
    ref = _llm(word_dir).generate(prompts, params, use_tqdm=False)
    padded = _llm(word_dir)
    graphs = _attach_padded(padded, [1, 2, 4, 8])
    got = padded.generate(prompts, params, use_tqdm=False)
    assert [[c.token_ids for c in o.outputs] for o in got] == \
        [[c.token_ids for c in o.outputs] for o in ref]
    for o_got, o_ref in zip(got, ref, strict=True):
        for c_got, c_ref in zip(o_got.outputs, o_ref.outputs, strict=True):
            for a, b in zip(c_got.logprobs, c_ref.logprobs, strict=True):
                assert a.keys() == b.keys()
                assert all(abs(a[t] - b[t]) < 1e-4 for t in a)
    assert sum(graphs.replays.values()) > 0


# ---- reporting: start-up phase and /metrics ------------------------------------------------


def _graph_engine_double(num_graphs: int):
    stats = {"num_cuda_graphs": num_graphs, "cuda_graph_capture_seconds": 1.5 * (num_graphs > 0),
             "cuda_graph_memory_bytes": (96 << 20) * (num_graphs > 0), "num_total_blocks": 10}
    stats["startup"] = {"demo_build_seconds": 0.0, "weight_load_seconds": 2.0,
                        "weight_bytes": int(4e9), "kernel_warmup_seconds": 0.0,
                        "device": "cuda"}
    return SimpleNamespace(stats=lambda: stats)


def test_startup_phases_split_out_the_capture():
    from edge_llm.server.hooks import StartupPhases

    phases = StartupPhases()
    phases.record_engine(_graph_engine_double(35), construct_seconds=5.0)
    assert phases.seconds["weight_load"] == 2.0
    assert phases.seconds["cuda_graphs"] == 1.5
    assert phases.seconds["kv_allocation"] == pytest.approx(1.5)
    eager = StartupPhases()
    eager.record_engine(_graph_engine_double(0), construct_seconds=5.0)
    assert "cuda_graphs" not in eager.seconds and eager.seconds["kv_allocation"] == 3.0


def test_metrics_export_the_capture():
    from edge_llm.server.metrics import ServerMetrics

    engine = _graph_engine_double(35)
    text = ServerMetrics(engine.stats, lambda: "m").render().decode()
    assert 'edge_llm:num_cuda_graphs{model_name="m"} 35.0' in text
    assert 'edge_llm:cuda_graph_capture_seconds{model_name="m"} 1.5' in text
    line = next(x for x in text.splitlines() if x.startswith("edge_llm:cuda_graph_memory_bytes{"))
    assert float(line.split()[-1]) == 96 << 20


def test_capture_stats_and_release(monkeypatch):
    """The accounting both graph sets share (unit, the CUDA calls stubbed): sizes sorted,
    memory = the drop in free memory plus the static buffers, never negative; release
    resets every graph and forgets the sizes left for capture on first use."""
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty"))
    free = [1000]
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free[0], 2000))

    class FakeGraph:
        def __init__(self):
            self.was_reset = False

        def reset(self):
            self.was_reset = True

    graphs = {8: FakeGraph(), 1: FakeGraph(), 4: FakeGraph()}
    buffers = (torch.zeros(10, dtype=torch.int64), torch.zeros(3, 5, dtype=torch.float16))
    st = capture_stats(graphs, 0.0, 1600, torch.device("cpu"), buffers)
    assert st.sizes == (1, 4, 8) and st.memory_bytes == 600 + 80 + 30 and st.seconds > 0
    assert calls == ["sync", "empty"]
    free[0] = 1700  # more free than before (another process let go): held = buffers only
    assert capture_stats(graphs, 0.0, 1600, torch.device("cpu"), buffers).memory_bytes == 110
    lazy = {16, 32}
    kept = list(graphs.values())
    release_graphs(graphs, lazy)
    assert not graphs and not lazy and all(g.was_reset for g in kept)


def test_capture_warms_up_through_the_first_layer_only(monkeypatch):
    """``capture_graph`` (unit, the CUDA calls stubbed): given the model, the eager run
    before the capture goes through its first layer only and the captured run through all
    of them; without the model, both run whole."""
    import contextlib

    import edge_llm.engine.graph_capture as cg

    events = []

    class FakeStream:
        def wait_stream(self, other):
            pass

        def synchronize(self):
            events.append("sync")

    class FakeGraph:
        def capture_begin(self, pool=None, capture_error_mode=None):
            events.append("begin")

        def capture_end(self):
            events.append("end")

    class FakeArch:  # one kind of layer: the warm-up needs the first only
        num_layers = 4

        @staticmethod
        def layer_window(layer):
            return None

    class FakeModel:
        num_active_layers = None
        arch = FakeArch

        @contextlib.contextmanager
        def first_layers(self, n):
            self.num_active_layers = n
            try:
                yield
            finally:
                self.num_active_layers = None

    monkeypatch.setattr(cg, "capture_stream", lambda device: FakeStream())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: FakeStream())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    model = FakeModel()
    forward = lambda: events.append(("forward", model.num_active_layers))  # noqa: E731
    cg.capture_graph(forward, None, torch.device("cpu"), model)
    assert events == [("forward", 1), "sync", "begin", ("forward", None), "end"]
    events.clear()
    cg.capture_graph(forward, None, torch.device("cpu"))
    assert events == [("forward", None), "sync", "begin", ("forward", None), "end"]


def test_capture_or_release(monkeypatch, caplog):
    """A capture that raises leaves its graph set released and a warning naming the error
    and what runs eagerly; a capture that works returns its stats (unit, CUDA stubbed)."""
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)

    class FakeSet:
        released = False

        def release(self):
            self.released = True

    def refuse():
        raise RuntimeError("operation not permitted when stream is capturing")

    ok, bad, stats = FakeSet(), FakeSet(), GraphStats((1, 2), 0.5, 7)
    assert capture_or_release(ok, lambda: stats, "decode runs") is stats and not ok.released
    with caplog.at_level(logging.WARNING, logger="edge_llm.engine.cuda_graphs"):
        assert capture_or_release(bad, refuse, "prefills run") is None
    assert bad.released
    assert ("CUDA graph capture failed, prefills run eagerly (RuntimeError: operation not "
            "permitted when stream is capturing)") in caplog.text


@pytest.mark.parametrize("arch,layers", [("LlamaForCausalLM", 1), ("Phi3ForCausalLM", 1),
                                         ("Gemma2ForCausalLM", 2), ("Gemma3ForCausalLM", 2)])
def test_warm_ups_run_one_layer_of_each_kind(arch, layers):
    """A warm-up forward runs the shortest prefix of layers holding every kind the config
    declares: a sliding-window layer launches other kernel variants than a full-attention
    one, and a variant first met while serving (or inside a graph capture) compiles then."""
    from edge_llm.engine.graph_capture import warmup_layers
    from edge_llm.model.arch import parse_arch_config
    from tests.helpers import tiny_hf_model

    parsed = parse_arch_config(tiny_hf_model(arch).config.to_dict())
    n = warmup_layers(parsed)
    assert n == layers
    kinds = {parsed.layer_window(i) is None for i in range(parsed.num_layers)}
    assert {parsed.layer_window(i) is None for i in range(n)} == kinds
