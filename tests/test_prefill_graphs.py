"""Short-step CUDA graphs (steps that prefill, one sequence or several, decode rows alongside),
the parts that run anywhere (eligibility and the layout alone: tests/test_prefill_layout.py):
the padded forward (``PrefillGraphs.run`` without a captured graph runs it eagerly, the same
code as the graph body) against the plain eager step, on CPU. The KV cache is filled with NaN
first, so a padding rule that lets a real row read an unwritten slot (or a padding row write
one) shows up. The captured graphs: tests/test_prefill_graphs_gpu.py.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from edge_llm import LLM, SamplingParams
from edge_llm.engine.prefill_graphs import (
    PREFILL_SIZES,
    PrefillGraphs,
    is_short_step,
    num_slots,
    prefill_inputs,
)
from tests.test_cuda_graphs import random_prompts, run_traffic, word_model
from tests.test_prefill_layout import _row

BLOCK = 8
MAX_LEN = 256


def test_bad_sizes_and_cpu_capture(word_dir):
    runner = _llm(word_dir).engine.runner
    with pytest.raises(ValueError, match="ascending"):
        PrefillGraphs(runner.model, runner.kv.layers, MAX_LEN, BLOCK, runner.device, (16, 8))
    with pytest.raises(ValueError, match=">= 2"):
        PrefillGraphs(runner.model, runner.kv.layers, MAX_LEN, BLOCK, runner.device, (1, 8))
    graphs = PrefillGraphs(runner.model, runner.kv.layers, MAX_LEN, BLOCK, runner.device)
    with pytest.raises(RuntimeError, match="CUDA device"):
        graphs.capture()
    with pytest.raises(ValueError, match="not a short step"):
        graphs.run([_row(range(513), 0, list(range(1, 66)))])
    with pytest.raises(ValueError, match="max_seqs"):
        PrefillGraphs(runner.model, runner.kv.layers, MAX_LEN, BLOCK, runner.device, max_seqs=0)
    few = PrefillGraphs(runner.model, runner.kv.layers, MAX_LEN, BLOCK, runner.device,
                        max_seqs=2)
    assert few.logits.shape == (2, 512) and few.seq_lens.shape == (3,)
    assert not few.can_run([_row([1], 7, [1]), _row([1], 9, [2]), _row([2, 3], 0, [3])])
    shared = torch.zeros(4, 512)  # a (decode graphs') buffer of 4 rows caps max_seqs at 4
    capped = PrefillGraphs(runner.model, runner.kv.layers, MAX_LEN, BLOCK, runner.device,
                           max_seqs=8, logits=shared)
    assert capped.max_seqs == 4 and capped.logits is shared


# ---- the padded forward on CPU --------------------------------------------------------------


@pytest.fixture(scope="module")
def word_dir(tmp_path_factory) -> Path:
    return word_model(tmp_path_factory.mktemp("prefill-graphs-cpu"))


def _llm(path: Path, **kw) -> LLM:
    kw = {"device": "cpu", "dtype": "float32", "max_model_len": MAX_LEN, "block_size": BLOCK,
          "max_num_seqs": 8, "max_num_batched_tokens": 128, "swap_space": 0.0,
          "kv_cache_memory": 1 << 22, **kw}  # 4 MiB: the tests clone the whole cache
    return LLM(str(path), **kw)


@pytest.fixture(scope="module")
def runner(word_dir):
    return _llm(word_dir).engine.runner


def _fill_nan(runner) -> None:
    for k, v in runner.kv.layers:
        k.fill_(float("nan"))
        v.fill_(float("nan"))


def _eager(runner, s) -> torch.Tensor:
    """The plain eager step of one scheduled row: logits of every new token."""
    with torch.inference_mode():
        ids, pos, meta, _, _ = runner._prepare([s])
        return runner.model.compute_logits(runner.model(ids, pos, runner.kv.layers, meta))


def _setup_many(runner, shapes: list[tuple[int, int]], seed: int) -> list:
    """A NaN cache; per (n, start) a shuffled block table (block 0 and the other sequences'
    blocks never in it) and the prefix's K/V written by an eager prefill; returns the
    scheduled rows of the new tokens."""
    rng = random.Random(seed)
    need = [-(-(start + n) // BLOCK) for n, start in shapes]
    free = rng.sample(range(1, runner.kv.layers[0][0].shape[0]), sum(need))
    _fill_nan(runner)
    rows = []
    for (n, start), k in zip(shapes, need, strict=True):
        blocks, free = free[:k], free[k:]
        tokens = [rng.randrange(3, 512) for _ in range(start + n)]
        if start:
            _eager(runner, _row(tokens[:start], 0, blocks))
        rows.append(_row(tokens[start:], start, blocks))
    return rows


def _setup(runner, n: int, start: int, seed: int):
    """``_setup_many`` of one sequence."""
    return _setup_many(runner, [(n, start)], seed)[0]


def _snapshot(runner) -> list[torch.Tensor]:
    return [t.clone() for kv in runner.kv.layers for t in kv]


CASES = [(n, start) for n in range(2, 65) for start in (0, 13)] + [
    (2, 7), (9, 8), (24, 40), (24, 200), (33, 95), (64, 190), (64, 1),
    (65, 0), (100, 13), (128, 0), (129, 40), (200, 50), (256, 0)]


@pytest.mark.parametrize("n, start", CASES)
def test_padded_logits_equal_eager_logits(runner, n, start):
    """The last real row's logits equal the eager step's; the cache after the padded step
    equals the cache after the eager one (every real row wrote the K/V the eager rows wrote,
    layer by layer; padding rows wrote nothing: the NaN slots stay NaN)."""
    s = _setup(runner, n, start, seed=100 * n + start)
    before = _snapshot(runner)
    eager = _eager(runner, s)
    after_eager = _snapshot(runner)
    for t, b in zip((t for kv in runner.kv.layers for t in kv), before, strict=True):
        t.copy_(b)
    graphs = PrefillGraphs(runner.model, runner.kv.layers, MAX_LEN, BLOCK, runner.device)
    got = graphs.run([s])
    t_pad = next(t for t in PREFILL_SIZES if t >= n)
    assert graphs.replays == {t_pad: 1}
    assert got.shape == (1, 512) and eager.shape == (n, 512)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, eager[-1:], rtol=1e-5, atol=1e-5)
    for a, b in zip(_snapshot(runner), after_eager, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, equal_nan=True)


MANY = [
    [(1, 30), (5, 0)],  # a decode row and a new prompt
    [(3, 0), (4, 0)],  # two prompts together
    [(1, 10), (1, 20), (1, 5), (40, 13)],  # decode rows and a tail after a cached prefix
    [(1, 100)] * 7 + [(2, 0)],  # 8 sequences in the 16-row bucket
    [(9, 0), (7, 3)],  # 16 tokens: no padding rows
    [(1, 50), (33, 0), (60, 17), (1, 9), (2, 70)],  # 97 tokens: the 128-row bucket
    [(1, 15)] * 6 + [(2, 0), (2, 0)],  # 8 sequences, 10 tokens, max_seqs 8: every slot used
]


@pytest.mark.parametrize("shapes", MANY, ids=lambda m: "-".join(f"{n}@{s}" for n, s in m))
def test_padded_logits_equal_eager_logits_several_sequences(runner, shapes):
    """Each sequence's last-row logits equal the eager step's row, and the cache after the
    padded step equals the cache after the eager one (no padding row or empty slot wrote
    anything; every real row wrote what the eager rows wrote)."""
    rows = _setup_many(runner, shapes, seed=sum(n * 31 + s for n, s in shapes))
    before = _snapshot(runner)
    with torch.inference_mode():
        ids, pos, meta, _, _ = runner._prepare(rows)
        eager = runner.model.compute_logits(runner.model(ids, pos, runner.kv.layers, meta))
    last = torch.tensor(shapes)[:, 0].cumsum(0) - 1  # each sequence's last row
    after_eager = _snapshot(runner)
    for t, b in zip((t for kv in runner.kv.layers for t in kv), before, strict=True):
        t.copy_(b)
    graphs = PrefillGraphs(runner.model, runner.kv.layers, MAX_LEN, BLOCK, runner.device,
                           max_seqs=8)
    assert graphs.can_run(rows)
    got = graphs.run(rows)
    t_pad = next(t for t in PREFILL_SIZES if t >= sum(n for n, _ in shapes))
    assert graphs.replays == {t_pad: 1}
    assert got.shape == (len(shapes), 512) and torch.isfinite(got).all()
    torch.testing.assert_close(got, eager[last], rtol=1e-5, atol=1e-5)
    for a, b in zip(_snapshot(runner), after_eager, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, equal_nan=True)


def _run_mutated(runner, s, t: int, mutate) -> torch.Tensor:
    """The padded forward with the layout changed by ``mutate(inputs, n, start)``."""
    graphs = PrefillGraphs(runner.model, runner.kv.layers, MAX_LEN, BLOCK, runner.device)
    host = prefill_inputs([s], t, num_slots(t, graphs.max_seqs), BLOCK)
    mutate(host, s.num_scheduled_tokens, s.start_pos)
    with torch.inference_mode():
        graphs.load(host)
        graphs._forward(t)
    return graphs.logits[:1].clone()


def _one_sequence(host, n, start):  # padding inside the real sequence, seq_len start + T
    t = host.input_ids.shape[0]
    host.positions[n:] = torch.arange(start + n, start + t)
    host.query_start_loc[1:] = t
    host.seq_lens[:] = 0
    host.seq_lens[0] = start + t


def _one_sequence_short(host, n, start):  # the same with seq_len start + n: shifted queries
    _one_sequence(host, n, start)
    host.seq_lens[0] = start + n


def _seq_len_plus_one(host, n, start):
    host.seq_lens[0] += 1


def _positions_off(host, n, start):
    host.positions[:n] += 1


@pytest.mark.parametrize("mutate", [_one_sequence, _one_sequence_short, _seq_len_plus_one,
                                    _positions_off])
def test_mutated_padding_rules_change_the_logits(runner, mutate):
    """The equality above is not vacuous: each wrong padding rule changes the real rows."""
    n, start = 5, 21  # the prefix ends mid-block; padding spans the next block
    s = _setup(runner, n, start, seed=7)
    before = _snapshot(runner)
    eager = _eager(runner, s)
    for t, b in zip((t for kv in runner.kv.layers for t in kv), before, strict=True):
        t.copy_(b)
    got = _run_mutated(runner, s, 8, mutate)
    assert not torch.allclose(got, eager[-1:], rtol=1e-3, atol=1e-3, equal_nan=False)


def test_padding_writing_slots_corrupts_the_cache(runner):
    n, start = 5, 21
    s = _setup(runner, n, start, seed=8)
    before = _snapshot(runner)
    _run_mutated(runner, s, 8, lambda h, n, start: None)
    good = _snapshot(runner)
    for t, b in zip((t for kv in runner.kv.layers for t in kv), before, strict=True):
        t.copy_(b)
    first = s.block_table[0] * BLOCK  # padding rows writing over the prefix's first slots
    _run_mutated(runner, s, 8, lambda h, n, start: h.slot_mapping[n:].copy_(
        first + torch.arange(8 - n)))
    bad = _snapshot(runner)
    assert not all(torch.allclose(a, b, equal_nan=True) for a, b in zip(good, bad, strict=True))


# ---- the engine: mixed traffic, prefix hits -------------------------------------------------


def test_engine_routes_eligible_steps_and_tokens_equal_eager(word_dir):
    """Prompts sharing a 40-token prefix (prefix-cache hits leave short tails), long prompts
    (chunked), a prompt-logprobs request (never eligible), arrivals that overlap (several
    prompts in one step; prompts joining decoding sequences). Tokens equal the plain engine's;
    exactly the eligible steps took the padded path: every step of 2 or more tokens here (the
    CPU runner has no decode graphs to take the decode-only ones first)."""
    rng = random.Random(4)
    shared = [rng.randrange(3, 512) for _ in range(40)]
    tails = random_prompts(6, 512, 2, 60, seed=9)
    alone = [shared + t for t in tails] + [  # each arrives alone: 9 steps apart, 6 tokens
        random_prompts(1, 512, n, n, seed=n)[0] for n in (5, 17, 33, 148, 200)]
    arrivals = [(9 * i, p) for i, p in enumerate(alone)]
    # arrivals during others' decodes or together: multi-sequence steps
    arrivals += [(2, alone[0][:30]), (30, alone[1][:50]), (120, alone[2]), (120, alone[3])]
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=6)
    ref = run_traffic(_llm(word_dir), arrivals, params)
    llm = _llm(word_dir)
    runner = llm.engine.runner
    graphs = PrefillGraphs(runner.model, runner.kv.layers, MAX_LEN, BLOCK, runner.device,
                           max_seqs=8)
    runner.prefill_graphs = graphs
    taken, eligible, shapes, execute = [], [], [], runner.execute
    empty = []  # steps with nothing scheduled: no forward at all

    def recording_execute(sched):
        empty.append(not sched.scheduled)
        count = sum(graphs.replays.values())
        eligible.append(is_short_step(sched.scheduled, 512, 8))
        if eligible[-1]:
            shapes.append([(s.num_scheduled_tokens, s.start_pos) for s in sched.scheduled])
        out = execute(sched)
        taken.append(sum(graphs.replays.values()) > count)
        return out

    runner.execute = recording_execute
    got = run_traffic(llm, arrivals, params)
    assert {k: c.token_ids for k, c in got.items()} == {k: c.token_ids for k, c in ref.items()}
    assert taken == eligible
    assert len(taken) - sum(taken) >= 20  # one-sequence decode steps stayed eager
    eager = len(taken) - sum(taken) - sum(empty)
    assert runner.step_paths == {"short_graph": sum(taken), "eager": eager}
    assert llm.engine.stats()["forward_steps"] == {
        "decode_graph": 0, "short_graph": sum(taken), "eager": eager}
    assert len(graphs.replays) >= 3, graphs.replays  # several buckets
    prefills = [m for m in shapes if any(n > 1 for n, _ in m)]
    one = [m[0][1] for m in prefills if len(m) == 1]
    # short prompts (start 0), tails after a prefix-cache hit (40), a long prompt's last chunk
    assert {0, 40, 128} <= set(one), one
    mixed = [m for m in prefills if any(n == 1 for n, _ in m)]  # prompts joining decodes
    together = [m for m in prefills if sum(n > 1 for n, _ in m) > 1]  # several prompts
    assert len(mixed) >= 2 and together, (mixed, together)
    assert len(shapes) > len(prefills)  # decode-only steps of several rows as well
    llm.engine.check_integrity()


def test_prompt_logprobs_request_stays_eager(word_dir):
    llm = _llm(word_dir, enable_prefix_caching=False)
    runner = llm.engine.runner
    graphs = PrefillGraphs(runner.model, runner.kv.layers, MAX_LEN, BLOCK, runner.device)
    runner.prefill_graphs = graphs
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, prompt_logprobs=1)
    out = llm.generate([{"prompt_token_ids": list(range(5, 25))}], params, use_tqdm=False)
    assert len(out[0].prompt_logprobs) == 20 and sum(graphs.replays.values()) == 0
    plain = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    llm.generate([{"prompt_token_ids": list(range(5, 25))}], plain, use_tqdm=False)
    assert graphs.replays == {32: 1}


def test_cpu_runner_never_captures(word_dir):
    llm = _llm(word_dir)
    assert llm.engine.runner.prefill_graphs is None
    assert llm.engine.stats()["num_prefill_cuda_graphs"] == 0
