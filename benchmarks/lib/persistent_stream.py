"""A decode step as one persistent kernel of pure streams: what a persistent layer kernel could
reach at best, beside ``chain_ceiling``'s step of separate kernels (``kernels_bench.py
ceiling`` times both).

Each of ``programs`` resident programs walks the step's phases (per layer: qkv, attention's
K / V, o, gate/up, down; then the lm_head). In phase ``ph`` a program sums its contiguous
``tiles[ph]`` tiles of ``BLOCK`` int32 words (its share of the phase's bytes), writes one word
of "activation", and waits at a grid barrier for every program to finish the phase, as a
persistent layer kernel must wait for the whole of a linear's output before the next linear
reads it. After the barrier each program reads the word another program wrote (the
activation round trip a real phase starts with) before it adds its first chunk.

``PREFETCH``: a program loads its first chunk of the next phase (``UNROLL`` tiles) before it
waits at the barrier: weights do not depend on activations, so a persistent kernel can keep
the weight stream going across the barrier. Without it the chunk loads after the barrier,
as a kernel boundary does without PDL.

The barrier: every program adds one to a counter (release, gpu scope) and spins on a volatile
load until the counter reaches ``programs * (ph + 1)``, then an acquire read of it. (A barrier
by per-program flags, each program releasing its own flag and spinning on the least of all,
gave no faster step: BENCHMARKS.md, "Decode"; deleted.) The counter is zeroed before each
launch, and every program must be resident at once (``programs`` at most one or two a
multiprocessor): a program waiting for one that never starts gives up after ``SPIN_LIMIT``
reads and counts itself in ``cnt[1]``, so a grid that does not fit shows as an error instead
of a hang.
Under ``TRITON_INTERPRET=1`` programs run one after another, so only one program can be checked
there (``smoke``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# volatile reads of the counter before a waiting program gives up (milliseconds)
SPIN_LIMIT = tl.constexpr(1 << 20)
UNROLL = 8  # tiles a program loads at once (8 x 4 KB in flight with BLOCK 1024)


@triton.jit
def _persistent_stream_kernel(src, bases, tiles_of, act, cnt, out, phases, programs,
                              BLOCK: tl.constexpr, UNROLL: tl.constexpr,
                              PREFETCH: tl.constexpr):
    """Program p: for each phase, sum words [bases[ph] + p * tiles * BLOCK, + tiles * BLOCK),
    in chunks of UNROLL tiles loaded at once, into out[p] (int32, wrapping)."""
    pid = tl.program_id(0)
    row = tl.arange(0, UNROLL)[:, None]  # the tile of a chunk (masks whole tiles: 16-byte loads)
    offs = row * BLOCK + tl.arange(0, BLOCK)[None, :]
    acc = tl.zeros([UNROLL, BLOCK], tl.int32)
    tiles = tl.load(tiles_of)
    start = tl.multiple_of(tl.load(bases), 4) + pid.to(tl.int64) * tiles * BLOCK
    nxt = tl.load(src + start + offs, mask=row < tiles, other=0)
    for ph in range(phases):
        cur = nxt
        if ph > 0:  # the word another program wrote before the barrier, added once
            x = tl.load(act + ((ph & 1) * programs + (pid + 1) % programs), volatile=True)
            cur += tl.where(offs == 0, x, 0)
        acc += cur
        for c in range(UNROLL, tiles, UNROLL):
            acc += tl.load(src + start + c * BLOCK + offs, mask=c + row < tiles, other=0)
        nph = tl.minimum(ph + 1, phases - 1)  # the last phase loads its own first chunk again
        tiles = tl.load(tiles_of + nph)
        start = tl.multiple_of(tl.load(bases + nph), 4) + pid.to(tl.int64) * tiles * BLOCK
        if PREFETCH:
            nxt = tl.load(src + start + offs, mask=row < tiles, other=0)
        tl.store(act + (((ph + 1) & 1) * programs + pid), tl.sum(tl.sum(acc, 1), 0))
        tl.debug_barrier()  # every thread of this program has issued its stores
        spins = 0
        # one counter: every program's two atomics on it run one after another
        tl.atomic_add(cnt, 1, sem="release", scope="gpu")
        target = programs * (ph + 1)
        seen = tl.load(cnt, volatile=True)
        while (seen < target) & (spins < SPIN_LIMIT):
            seen = tl.load(cnt, volatile=True)
            spins += 1
        tl.atomic_add(cnt, 0, sem="acquire", scope="gpu")
        if spins >= SPIN_LIMIT:  # a program never arrived: count it, do not hang
            tl.atomic_add(cnt + 1, 1, sem="relaxed", scope="gpu")
        if not PREFETCH:
            nxt = tl.load(src + start + offs, mask=row < tiles, other=0)
    tl.store(out + pid, tl.sum(tl.sum(acc, 1), 0))


def persistent_step(src: torch.Tensor, bases: torch.Tensor, tiles: torch.Tensor,
                    act: torch.Tensor, cnt: torch.Tensor, out: torch.Tensor, programs: int,
                    block: int, unroll: int, prefetch: bool, num_warps: int = 8) -> None:
    """One launch over ``bases.numel()`` phases (int64 word offsets into ``src``, multiples of
    4, and int32 tiles a program); ``act`` holds 2 * programs int32, ``cnt`` 2 int32 (the
    counter, the barrier time-outs), ``out`` programs int32. Zeroes the counter first (a
    second small kernel on the device); the time-outs add up."""
    cnt[0].zero_()
    _persistent_stream_kernel[(programs,)](src, bases, tiles, act, cnt, out, bases.numel(),
                                           programs, BLOCK=block, UNROLL=unroll,
                                           PREFETCH=prefetch, num_warps=num_warps)


def smoke(block: int) -> None:
    """One program under the interpreter: every phase's words summed, with and without the
    prefetch; the activation words enter the sum as the kernel defines them, and the program
    passes every barrier once."""
    phase_tiles = [3, 1, 0, 5, 2]
    bases, at = [], 0
    for t in phase_tiles:
        bases.append(at)
        at += t * block + 8  # phases need not be contiguous
    words = torch.randint(-1000, 1000, (at,), dtype=torch.int32)
    # the activation word read after each barrier is this program's running sum there (0 before
    # the first phase), so each phase doubles the sum before adding its words
    running = 0
    for b, t in zip(bases, phase_tiles, strict=True):
        running = 2 * running + int(words[b:b + t * block].sum())
    for prefetch in (False, True):
        for unroll in (1, 2, 4):
            act = torch.zeros(2, dtype=torch.int32)
            cnt = torch.zeros(2, dtype=torch.int32)
            out = torch.zeros(1, dtype=torch.int32)
            persistent_step(words, torch.tensor(bases, dtype=torch.int64),
                            torch.tensor(phase_tiles, dtype=torch.int32), act, cnt, out, 1,
                            block, unroll, prefetch, num_warps=4)
            got = int(out[0])
            assert got == _wrap(running), (prefetch, unroll, got, running)
            assert int(cnt[0]) == len(phase_tiles) and int(cnt[1]) == 0, cnt.tolist()


def _wrap(v: int) -> int:
    """v as int32 arithmetic leaves it."""
    return (v + (1 << 31)) % (1 << 32) - (1 << 31)
