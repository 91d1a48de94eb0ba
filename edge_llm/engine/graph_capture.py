"""How every CUDA graph, decode and prefill, is captured: on one side stream per device, after
an eager run of the same forward that loads its kernels and lets cuBLAS allocate the stream's
workspace outside any pool. A new stream per capture cost a cuBLAS workspace per stream,
allocated inside the capture and so kept in the pool for good. The eager run goes through
the model's first layer of each kind only (``warmup_forward``), as the kernel warm-up's
forwards do (startup_probes.py)."""

from __future__ import annotations

import contextlib

import torch


def warmup_layers(arch) -> int:
    """Decoder layers a warm-up forward runs: the shortest prefix of the model holding one
    layer of each kind its config declares (full attention, sliding window), since the layers
    of one kind launch the same kernel variants. 1 for the architectures without windows;
    Gemma 2 (sliding, full, ...): 2."""
    kinds = [arch.layer_window(i) is not None for i in range(arch.num_layers)]
    wanted = set(kinds)
    seen: set[bool] = set()
    for n, kind in enumerate(kinds, start=1):
        seen.add(kind)
        if seen == wanted:
            return n
    return 1


def warmup_forward(model):
    """The context of a warm-up forward of ``model``: its first ``warmup_layers`` layers."""
    return model.first_layers(warmup_layers(model.arch))


_CAPTURE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def capture_stream(device: torch.device) -> torch.cuda.Stream:
    """The one side stream that every graph of ``device`` is warmed up and captured on
    (capture cannot run on the default stream)."""
    key = torch.device("cuda", device.index if device.index is not None
                       else torch.cuda.current_device())
    stream = _CAPTURE_STREAMS.get(key)
    if stream is None:
        stream = _CAPTURE_STREAMS[key] = torch.cuda.Stream(key)
    return stream


def capture_graph(forward, pool, device: torch.device, model=None) -> torch.cuda.CUDAGraph:
    """Run ``forward()`` once eagerly (compiles kernels; cuBLAS allocates the stream's
    workspace outside any pool), then capture it into ``pool``, both on ``capture_stream``.
    ``model`` (the CausalLM ``forward`` runs): the eager run goes through its first layer
    only (``first_layers``; every layer launches the same kernel variants), which saves the
    Python of a whole forward per graph at start-up (~45 ms for a 7B on the GPU host)."""
    stream = capture_stream(device)
    current = torch.cuda.current_stream(device)
    stream.wait_stream(current)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        with contextlib.nullcontext() if model is None else warmup_forward(model):
            forward()
        stream.synchronize()
        # thread_local: other threads' CUDA calls (the server's) do not break capture
        graph.capture_begin(pool=pool, capture_error_mode="thread_local")
        try:
            forward()
        finally:
            graph.capture_end()
    current.wait_stream(stream)
    return graph
