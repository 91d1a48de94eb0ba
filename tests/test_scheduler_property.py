"""Property test: random workloads on tiny budgets keep every scheduler invariant.

Hypothesis draws a configuration (block size, token budget, max_num_seqs, max_model_len, a
few GPU blocks, a few or no CPU slots, prefix caching on/off) and requests (arrival step,
prompt length, shared prefixes, max_tokens, min_tokens, stop ids, n, aborts, some between
schedule and update). Each step is replayed on a fake KV cache. Checked after every step:
integrity, limits, block tables covering their rows, writes only into exclusively owned
blocks, shared blocks either full or siblings'; and at the end: everything finished within a
step bound (no livelock), all blocks free, and every request that was not aborted produced
exactly the tokens of a run with ample resources (aborted ones a prefix of them).
"""

from __future__ import annotations

import hashlib
import random
from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_llm.config import CacheConfig, SchedulerConfig
from edge_llm.engine.scheduler import Scheduler, SchedulerOutput
from edge_llm.engine.sequence import Sequence
from edge_llm.sampling_params import SamplingParams

VOCAB = 64  # small, so that stop ids are sampled now and then
STOP_ID = 3


def fake_token(seq: Sequence) -> int:
    data = f"{seq.index}|{seq.num_tokens}|{seq.all_token_ids[-5:]}".encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=4).digest(), "little") % VOCAB


@st.composite
def workloads(draw: st.DrawFn) -> dict:
    bs = draw(st.sampled_from([8, 16]))
    max_num_seqs = draw(st.integers(1, 6))
    max_model_len = draw(st.integers(8, 120))
    chunked = draw(st.sampled_from([True, True, True, False]))  # unchunked: a big budget
    budget = draw(st.integers(max_num_seqs, 40))
    if not chunked:
        budget = max(budget, max_model_len)
    cfg = {
        "sched": SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=budget,
            max_model_len=max_model_len,
            enable_chunked_prefill=chunked,
        ),
        "cache": CacheConfig(block_size=bs, enable_prefix_caching=draw(st.booleans())),
        "gpu": draw(st.integers(2, 2 * (-(-max_model_len // bs)) + 2)),
        "cpu": draw(st.sampled_from([0, 1, 3, 8, 64])),
        "seed": draw(st.integers(0, 2**32 - 1)),
    }
    request = st.fixed_dictionaries(
        {
            "step": st.integers(0, 25),
            "arrival": st.floats(0, 100),
            "len": st.integers(1, max_model_len + 1),
            "shared": st.booleans(),
            "max_tokens": st.one_of(st.none(), st.integers(1, 30)),
            "min_tokens": st.integers(0, 3),
            "stop": st.booleans(),
            "n": st.integers(1, min(3, max_num_seqs)),
            "abort": st.one_of(st.none(), st.integers(0, 60)),
            "abort_mid_step": st.booleans(),
        }
    )
    cfg["requests"] = draw(st.lists(request, min_size=1, max_size=8))
    return cfg


def make_params(r: dict) -> SamplingParams:
    max_tokens = r["max_tokens"]
    min_tokens = r["min_tokens"] if max_tokens is None else min(r["min_tokens"], max_tokens)
    return SamplingParams(
        n=r["n"],
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        stop_token_ids=[STOP_ID] if r["stop"] else None,
    )


def prompts_of(w: dict) -> list[list[int]]:
    rng = random.Random(w["seed"])
    base = [rng.randrange(VOCAB) for _ in range(200)]
    return [
        base[: r["len"]] if r["shared"] else [rng.randrange(VOCAB) for _ in range(r["len"])]
        for r in w["requests"]
    ]


def check_step(sched: Scheduler, out: SchedulerOutput, kv: dict) -> None:
    bs, pool = sched.block_size, sched.pool
    assert out.num_batched_tokens <= sched.config.max_num_batched_tokens
    assert len(out.scheduled) <= sched.config.max_num_seqs
    for g, c in out.blocks_to_swap_out:
        kv[("cpu", c)] = dict(kv.get(("gpu", g), {}))
    for c, g in out.blocks_to_swap_in:
        kv[("gpu", g)] = dict(kv.get(("cpu", c), {}))
    for src, dst in out.blocks_to_copy:
        kv[("gpu", dst)] = kv.get(("gpu", src), {}).copy()
    for r in out.scheduled:
        end = r.start_pos + r.num_scheduled_tokens
        assert len(r.block_table) * bs >= end and r.start_pos == r.seq.num_computed_tokens
        assert r.token_ids == r.seq.all_token_ids[r.start_pos : end]
        for i, p in enumerate(range(r.start_pos, end)):
            block = r.block_table[p // bs]
            assert pool.ref_count(block) == 1, f"row writes into shared block {block}"
            kv.setdefault(("gpu", block), {})[p % bs] = r.token_ids[i]
    for r in out.scheduled:
        end = r.start_pos + r.num_scheduled_tokens
        seen = [kv.get(("gpu", r.block_table[p // bs]), {}).get(p % bs) for p in range(end)]
        assert seen == r.seq.all_token_ids[:end], f"wrong KV for {r.seq!r}"


def check_sharing(sched: Scheduler) -> None:
    holders = defaultdict(list)
    for seq in sched.running:
        for i, b in enumerate(seq.block_table):
            holders[b].append((seq, i))
    bs = sched.block_size
    for b, hs in holders.items():
        if len(hs) > 1:
            full = all((i + 1) * bs <= s.num_computed_tokens for s, i in hs)
            siblings = len({s.request_id for s, _ in hs}) == 1
            assert full or siblings, f"block {b} shared by {[s for s, _ in hs]}"


def run(w: dict, constrained: bool) -> tuple[dict, set[str], int]:
    """Drive the workload; returns outputs per (request, index), aborted ids, steps."""
    if constrained:
        sched = Scheduler(w["sched"], w["cache"], w["gpu"], w["cpu"])
    else:
        big = SchedulerConfig(
            max_num_seqs=64, max_num_batched_tokens=4096, max_model_len=w["sched"].max_model_len
        )
        sched = Scheduler(big, CacheConfig(block_size=16), 256, 0)  # 8 blocks x 24 seqs
    prompts, reqs = prompts_of(w), w["requests"]
    kv: dict = {}
    seqs: dict[tuple[str, int], Sequence] = {}
    aborted: set[str] = set()
    work = sum(r["n"] * (r["len"] + (r["max_tokens"] or 120)) for r in reqs)
    bound = 60 + max(r["step"] for r in reqs) + 4 * work
    # after the last arrival and abort, a step that changes nothing is repeated forever
    last_event = max([r["step"] for r in reqs] + [r["abort"] or 0 for r in reqs if constrained])
    for t in range(bound):
        for i, r in enumerate(reqs):
            if r["step"] == t:
                params = make_params(r)
                bs = sched.block_size
                max_len = sched.config.max_model_len
                out_max = min(params.max_tokens or max_len, max_len - r["len"])
                fits = r["len"] < max_len and -(-(r["len"] + out_max - 1) // bs) <= (
                    sched.pool.num_blocks
                )
                try:
                    sched.add_request(f"r{i}", prompts[i], params, r["arrival"])
                    assert fits
                except ValueError:
                    assert not fits
                    aborted.add(f"r{i}")  # refused: no output expected
        if constrained:
            for i, r in enumerate(reqs):
                if r["abort"] == t and not r["abort_mid_step"]:
                    aborted.add(f"r{i}")
                    sched.abort(f"r{i}")
        out = sched.schedule()
        sched.check_integrity()
        check_step(sched, out, kv)
        if constrained:
            for i, r in enumerate(reqs):
                if r["abort"] == t and r["abort_mid_step"]:
                    aborted.add(f"r{i}")
                    sched.abort(f"r{i}")
        sampled = {r.seq.seq_id: fake_token(r.seq) for r in out.scheduled if r.do_sample}
        for seq in sched.update_from_output(out, sampled):
            seqs[(seq.request_id, seq.index)] = seq
        sched.check_integrity()
        check_sharing(sched)
        idle = not (out.scheduled or out.preempted_seq_ids or out.blocks_to_swap_out
                    or out.blocks_to_swap_in or out.blocks_to_copy)
        if idle and t > last_event and sched.has_unfinished():
            raise AssertionError(f"no progress from step {t} on: {sched.stats()}")
        if t > max(r["step"] for r in reqs) and not sched.has_unfinished():
            assert sched.pool.num_free_blocks == sched.pool.num_blocks
            assert sched.swap_space.num_free == sched.swap_space.num_cpu_blocks
            outputs = {k: list(s.output_token_ids) for k, s in seqs.items()}
            return outputs, aborted, t
    raise AssertionError(f"not finished after {bound} steps: {sched.stats()}")


# examples, seed and deadline come from the hypothesis profile (tests/conftest.py)
@settings(suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_random_workloads_keep_invariants(w: dict) -> None:
    got, aborted, _ = run(w, constrained=True)
    want, refused, _ = run(w, constrained=False)
    for i, r in enumerate(w["requests"]):
        rid = f"r{i}"
        if rid in refused:
            continue
        for index in range(r["n"]):
            ref = want[(rid, index)]
            out = got.get((rid, index), None)
            if rid in aborted:
                assert out is None or out == ref[: len(out)]
            else:
                assert out == ref, f"{rid}[{index}] differs from the unconstrained run"
