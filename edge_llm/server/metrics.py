"""Prometheus metrics with vLLM's names, in a registry owned by one app (not the global one).

Engine state (queues, KV usage, prefix cache, preemptions) is read from ``engine.stats()`` at
scrape time; per-request figures (tokens, latencies, finish reasons) are observed by the server
as outputs stream by. Every engine series carries a ``model_name`` label. HTTP requests are
counted by route, method and status (``http_requests_total``, the name vLLM's
prometheus-fastapi-instrumentator uses, with the exact status rather than "4xx": a client
that left is a 499 of its own).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from edge_llm.outputs import RequestOutput

from .lifecycle import EngineHolder

TRACKERS_KEY = "edge_llm_trackers"  # scope["state"] key: the request's RequestTrackers
_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0)
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
_TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000)

# (metric name, engine stats keys (first present wins), help), read at scrape time
_GAUGES = (
    ("vllm:num_requests_running", ("num_requests_running", "num_running"),
     "Number of requests running."),
    ("vllm:num_requests_waiting", ("num_requests_waiting", "num_waiting"),
     "Number of requests waiting."),
    ("vllm:num_requests_swapped", ("num_requests_swapped", "num_swapped"),
     "Number of requests swapped to CPU."),
    ("vllm:gpu_cache_usage_perc", ("kv_cache_usage",), "KV-cache usage; 1 means 100 percent."),
    ("vllm:kv_cache_usage_perc", ("kv_cache_usage",), "KV-cache usage; 1 means 100 percent."),
    ("vllm:cpu_cache_usage_perc", ("cpu_swap_usage",), "CPU swap usage; 1 means 100 percent."),
    ("edge_llm:num_free_blocks", ("num_free_blocks",), "KV-cache blocks free (or cached)."),
    ("edge_llm:num_total_blocks", ("num_total_blocks",), "All KV-cache blocks."),
    ("edge_llm:num_cuda_graphs", ("num_cuda_graphs",),
     "Decode CUDA graphs captured (0: eager, --enforce-eager or no CUDA)."),
    ("edge_llm:cuda_graph_capture_seconds", ("cuda_graph_capture_seconds",),
     "Seconds the last capture of the decode CUDA graphs took (start-up or wake)."),
    ("edge_llm:cuda_graph_memory_bytes", ("cuda_graph_memory_bytes",),
     "Device memory held by the decode CUDA graphs (pool and static buffers)."),
)
_COUNTERS = (  # names without _total: the exposition adds it
    ("vllm:prefix_cache_queries", ("prefix_cache_queries", "prefix_queries"),
     "Prefix cache queries, in tokens."),
    ("vllm:prefix_cache_hits", ("prefix_cache_hits", "prefix_hits"),
     "Prefix cache hits, in tokens."),
    ("vllm:num_preemptions", ("num_preemptions",), "Cumulative number of preemptions."),
)


def _first(stats: dict, keys: tuple[str, ...]) -> float | None:
    for key in keys:
        if stats.get(key) is not None:
            return float(stats[key])
    return None


class _EngineStatsCollector:
    """Reads the engine's counters when Prometheus scrapes; nothing while it loads."""

    def __init__(self, stats: Callable[[], dict | None], model_name: Callable[[], str]) -> None:
        self._stats = stats
        self._model_name = model_name

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        if stats is None:
            return
        label = [self._model_name()]
        for family, table in ((GaugeMetricFamily, _GAUGES), (CounterMetricFamily, _COUNTERS)):
            for name, keys, doc in table:
                value = _first(stats, keys)
                if value is not None:
                    fam = family(name, doc, labels=["model_name"])
                    fam.add_metric(label, value)
                    yield fam
        steps = stats.get("forward_steps")
        if steps:  # a counter per path: how many forwards replayed a graph, how many ran eagerly
            fam = CounterMetricFamily("edge_llm:forward_steps", "Forwards launched, by path: "
                                      "decode_graph, short_graph (CUDA graph replays) or eager.",
                                      labels=["model_name", "path"])
            for path, count in sorted(steps.items()):
                fam.add_metric(label + [path], float(count))
            yield fam
        level = stats.get("sleep_level")
        if level is not None:  # vLLM's gauge: 1 on the engine's current state, 0 on the others
            fam = GaugeMetricFamily("vllm:engine_sleep_state", "The engine's sleep state: awake, "
                                    "weights_offloaded (level 1) or discard_all (level 2).",
                                    labels=["model_name", "sleep_state"])
            for state, at in (("awake", 0), ("weights_offloaded", 1), ("discard_all", 2)):
                fam.add_metric(label + [state], float(level == at))
            yield fam
        info = stats.get("cache_config")
        if info:  # vLLM's info gauge: always 1, the settings in its labels
            keys = sorted(info)
            fam = GaugeMetricFamily("vllm:cache_config_info", "The KV cache's settings.",
                                    labels=["model_name", *keys])
            fam.add_metric(label + [str(info[k]) for k in keys], 1.0)
            yield fam


class _PhaseCollector:
    """``edge_llm:startup_phase_seconds{phase=...}``: seconds of each start-up phase so far."""

    def __init__(self, phases: Callable[[], dict[str, float]]) -> None:
        self._phases = phases

    def collect(self) -> Iterator[Metric]:
        phases = self._phases()
        if phases:
            fam = GaugeMetricFamily("edge_llm:startup_phase_seconds",
                                    "Seconds of each start-up phase (ready: since process start).",
                                    labels=["phase"])
            for phase, seconds in phases.items():
                fam.add_metric([phase], seconds)
            yield fam


class ServerMetrics:
    """The app's registry; ``model_name`` is resolved lazily (the engine may still be loading).
    ``phases`` (optional) gives the start-up phase seconds exported as a gauge."""

    def __init__(self, stats: Callable[[], dict | None], model_name: Callable[[], str],
                 phases: Callable[[], dict[str, float]] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._model_name = model_name
        r, lab = self.registry, ["model_name"]
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prefill tokens processed.", lab,
                                     registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Generation tokens produced.",
                                         lab, registry=r)
        self.request_success = Counter("vllm:request_success", "Finished requests (choices).",
                                       lab + ["finished_reason"], registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token.", lab,
                              buckets=_TTFT_BUCKETS, registry=r)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Inter-token latency.", lab,
                             buckets=_ITL_BUCKETS, registry=r)
        self.tpot = Histogram("vllm:time_per_output_token_seconds",
                              "Time per output token (same observations as ITL).", lab,
                              buckets=_ITL_BUCKETS, registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency.",
                             lab, buckets=_E2E_BUCKETS, registry=r)
        self.request_prompt_tokens = Histogram(
            "vllm:request_prompt_tokens", "Prompt tokens per request.", lab,
            buckets=_TOKEN_BUCKETS, registry=r)
        self.request_generation_tokens = Histogram(
            "vllm:request_generation_tokens", "Generated tokens per request.", lab,
            buckets=_TOKEN_BUCKETS, registry=r)
        self.http_requests = Counter(
            "http_requests_total", "HTTP requests answered, by route template (none: no route "
            "matched), method and status (499: the client left first).",
            ["handler", "method", "status"], registry=r)
        self.registry.register(_EngineStatsCollector(stats, model_name))
        if phases is not None:
            self.registry.register(_PhaseCollector(phases))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def tracker(self, request: Any = None) -> RequestTracker:
        """A tracker for one engine request; with ``request`` (an HTTP request) it is also
        kept in the request's scope, so that its log line counts the tokens produced."""
        tracker = RequestTracker(self, self._model_name())
        if request is not None:
            request.scope.setdefault("state", {}).setdefault(TRACKERS_KEY, []).append(tracker)
        return tracker

    def observe_http(self, handler: str | None, method: str, status: int) -> None:
        """Count one answered HTTP request (``handler``: the route template, None if no route
        matched; unknown methods count as "other", keeping the label set bounded)."""
        self.http_requests.labels(handler or "none", method if method in _METHODS else "other",
                                  str(status)).inc()


class RequestTracker:
    """Observes one engine request's outputs: token counts, TTFT, ITL, e2e, finish reasons."""

    def __init__(self, metrics: ServerMetrics, model_name: str) -> None:
        self.m = metrics
        self.model = model_name
        self.start = time.perf_counter()
        self.last: float | None = None  # when the previous output arrived
        self.first_token_seen = False
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self._done: set[int] = set()
        self._choices = 0  # choices seen in the outputs so far
        # the series observed with every token, looked up once per request
        self._itl = metrics.itl.labels(model_name)
        self._tpot = metrics.tpot.labels(model_name)
        self._tokens = metrics.generation_tokens.labels(model_name)

    def observe(self, out: RequestOutput) -> None:
        now = time.perf_counter()
        m, model = self.m, self.model
        if self.last is None:
            self.prompt_tokens = len(out.prompt_token_ids)
            m.prompt_tokens.labels(model).inc(self.prompt_tokens)
            m.request_prompt_tokens.labels(model).observe(self.prompt_tokens)
        new = sum(len(c.token_ids_delta) for c in out.outputs)
        if new:
            if not self.first_token_seen:
                self.first_token_seen = True
                m.ttft.labels(model).observe(now - self.start)
            else:
                per_token = (now - self.last) / new
                for _ in range(new):
                    self._itl.observe(per_token)
                    self._tpot.observe(per_token)
            self.completion_tokens += new
            self._tokens.inc(new)
        self.last = now
        for c in out.outputs:
            if c.finish_reason is not None and c.index not in self._done:
                self._done.add(c.index)
                m.request_success.labels(model, c.finish_reason).inc()
        self._choices = max(self._choices, len(out.outputs))
        if out.finished:
            m.e2e.labels(model).observe(now - self.start)
            m.request_generation_tokens.labels(model).observe(self.completion_tokens)

    def aborted(self) -> None:
        """The request ended without finishing (client gone, sibling failed): its unfinished
        choices count as ``finished_reason="abort"``, as vLLM counts them."""
        open_choices = max(self._choices, 1) - len(self._done)
        if open_choices > 0:
            self.m.request_success.labels(self.model, "abort").inc(open_choices)
            self._done.update(range(-open_choices, 0))  # counted once


def usage_from_trackers(scope_state: dict) -> tuple[int, int] | None:
    """(prompt tokens, completion tokens) the request's trackers saw, if it had any."""
    trackers = scope_state.get(TRACKERS_KEY)
    if not trackers:
        return None
    return (sum(t.prompt_tokens for t in trackers), sum(t.completion_tokens for t in trackers))


def engine_stats(holder: EngineHolder) -> dict[str, Any] | None:
    engine = holder.engine
    return None if engine is None else engine.stats()
