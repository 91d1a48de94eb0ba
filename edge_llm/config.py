"""One frozen configuration tree; each component takes only its own part.

Built from keyword arguments (``LLM(...)``), CLI flags or ``EDGE_LLM_*`` environment variables.
Building does no I/O: values that need the model files (the context length, the dtype "auto")
are resolved later by the loader, which returns a resolved copy with ``dataclasses.replace``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SUPPORTED_DTYPES = ("auto", "float32", "float16", "bfloat16")
SUPPORTED_BLOCK_SIZES = (8, 16, 32)
MAX_CUDA_GRAPH_SIZE = 512  # vLLM's largest default capture size
# Tokens a chat reply sent without max_tokens may generate when neither the operator
# (--default-max-tokens) nor the model's generation_config.json (max_new_tokens) says: vLLM's
# default, the rest of the context, let the demo model ramble for minutes on a CPU.
DEFAULT_MAX_TOKENS = 1024


@dataclass(frozen=True)
class ModelConfig:
    model: str | None = None  # local folder or hub id; None means the built-in demo model
    revision: str | None = None
    dtype: str = "auto"
    device: str = "auto"  # "auto" picks cuda when available
    max_model_len: int | None = None  # None: the model's own context length
    seed: int = 0
    trust_remote_code: bool = False
    chat_template: str | None = None  # a file or an inline template overriding the tokenizer's

    def __post_init__(self) -> None:
        if self.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"dtype must be one of {SUPPORTED_DTYPES}, got {self.dtype!r}.")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}.")


KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")  # fp8_e4m3: vLLM's other name for it


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    kv_cache_memory: int | None = None  # bytes; overrides gpu_memory_utilization
    swap_space: float = 4.0  # GiB of (pinned on CUDA) host memory for swapped-out blocks
    enable_prefix_caching: bool = True
    num_gpu_blocks_override: int | None = None  # tests: force a tiny KV budget
    # "auto": the activations' dtype; "fp8": float8 e4m3 codes, unscaled (vLLM's "fp8"
    # without calibrated scales; kernels/kv_fp8.py): half the bytes per token
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        if self.block_size not in SUPPORTED_BLOCK_SIZES:
            raise ValueError(
                f"block_size must be one of {SUPPORTED_BLOCK_SIZES}, got {self.block_size}."
            )
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}."
            )
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise ValueError(f"kv_cache_memory must be > 0 bytes, got {self.kv_cache_memory}.")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                             f"got {self.kv_cache_dtype!r}.")
        if self.swap_space < 0:
            raise ValueError(f"swap_space must be >= 0 GiB, got {self.swap_space}.")
        if self.num_gpu_blocks_override is not None and self.num_gpu_blocks_override < 1:
            raise ValueError("num_gpu_blocks_override must be >= 1.")


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048  # resolved from ModelConfig and the model files
    enable_chunked_prefill: bool = True
    # A new sequence is admitted only if the cache keeps room for every running sequence's
    # next ``growth_reserve`` tokens (capped at what each may still generate), so admissions
    # do not fill the cache and force preemptions a few steps later; 0: no reserve.
    growth_reserve: int = 128
    # How a preempted sequence gives up its blocks: "recompute" (freed; prompt + outputs are
    # prefilled again) or "swap" (copied to the CPU swap space while it has room). None:
    # vLLM's rule, swap for a sequence that shares its request with siblings (n > 1), else
    # recompute: under memory pressure a recompute costs less than copying blocks out and back
    # over PCIe (BENCHMARKS.md, "Scheduler").
    preemption_mode: str | None = None
    # The token budget of a step that has running decodes (theirs included), when prefills are
    # chunked: a prompt joining them is cut to fit. "auto": the engine takes the largest
    # short-step CUDA graph's token count (engine/prefill_graphs.py), so that such a step
    # replays a graph instead of running eagerly for tens of milliseconds while every stream
    # waits; no cap when there are no such graphs. None or 0 (the default): no cap
    # (``max_num_batched_tokens``): "auto" trades throughput for inter-token p99 under load
    # (BENCHMARKS.md, "Serving under load").
    max_tokens_with_decodes: int | str | None = None

    def __post_init__(self) -> None:
        cap = self.max_tokens_with_decodes
        if cap is not None and cap != "auto" and (
                isinstance(cap, bool) or not isinstance(cap, int) or cap < 0):
            raise ValueError(f"max_tokens_with_decodes must be 'auto', None or >= 0 tokens "
                             f"(0: no cap), got {cap!r}.")
        if self.preemption_mode not in (None, "recompute", "swap"):
            raise ValueError(
                f"preemption_mode must be 'recompute' or 'swap', got {self.preemption_mode!r}."
            )
        if self.growth_reserve < 0:
            raise ValueError(f"growth_reserve must be >= 0 tokens, got {self.growth_reserve}.")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}.")
        if self.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}."
            )


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    enforce_eager: bool = False
    # decode batch sizes to capture as CUDA graphs (vLLM's cuda_graph_sizes); None: the
    # ladder of engine/cuda_graphs.py up to max_num_seqs. Larger decode steps run eagerly.
    cuda_graph_sizes: tuple[int, ...] | None = None
    # build a step's outputs while the GPU runs the next step (llm_engine.py); None: on a GPU
    async_output_proc: bool | None = None
    # with async outputs, launch a decode step's successor before its tokens reach the host
    # (engine/scheduler_ahead.py); None: on a GPU
    decode_run_ahead: bool | None = None
    debug_integrity: bool = False  # check the block pool whenever the engine goes idle

    def __post_init__(self) -> None:
        sizes = self.cuda_graph_sizes
        if sizes is not None:
            if not sizes or any(not isinstance(b, int) or b < 1 for b in sizes):
                raise ValueError(f"cuda_graph_sizes must be positive ints, got {sizes!r}.")
            if max(sizes) > MAX_CUDA_GRAPH_SIZE:
                raise ValueError(f"cuda_graph_sizes go up to {MAX_CUDA_GRAPH_SIZE}, got "
                                 f"{max(sizes)}.")
            object.__setattr__(self, "cuda_graph_sizes", tuple(sorted(set(sizes))))


@dataclass(frozen=True)
class ServerConfig:
    """Settings of the HTTP server (``edge-llm serve``); the engine's own settings live above."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None  # when set, every /v1 route needs "Authorization: Bearer <key>"
    served_model_name: str | None = None  # None: the engine's model_name
    max_queue: int | None = None  # sequences allowed to wait beyond max_num_seqs; None: none
    chat_template: str | None = None  # a file or an inline Jinja template; None: the tokenizer's
    max_body_bytes: int = 16 * 1024 * 1024
    log_requests: bool = True  # one info line per request
    ready_timeout: float = 600.0  # seconds a /v1 request waits for the model to finish loading
    retry_after: int = 1  # seconds, sent in Retry-After with 429 and 503
    # cross-site defences (edge_llm/server/guard.py): CORS is off unless origins are listed
    allowed_origins: tuple[str, ...] = ()  # "*" allows any origin
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)
    allow_credentials: bool = False
    # Host names accepted when bound to a loopback address (empty: loopback names only;
    # "*": any); the DNS-rebinding defence
    allowed_hosts: tuple[str, ...] = ()
    enable_sleep_endpoints: bool = False  # POST /sleep, POST /wake_up, GET /is_sleeping
    # what one request may ask for, checked before tokenizing (None: no limit)
    max_prompts_per_request: int | None = 256
    max_messages: int | None = 1024
    max_prompt_chars: int | None = 1_000_000
    # slow clients: seconds for a request's headers, then for its whole body; idle keep-alive
    header_read_timeout: float = 15.0
    body_read_timeout: float = 60.0
    timeout_keep_alive: float = 5.0
    # tokens a chat reply without max_tokens may generate; None: the model's
    # generation_config.json max_new_tokens, else DEFAULT_MAX_TOKENS; 0: the rest of the context
    default_max_tokens: int | None = None
    # vLLM's --generation-config: "auto" (the model's generation_config.json), "vllm" or a folder
    generation_config: str = "auto"
    # how tool calls / <think> reasoning are read out of replies: "auto" (from the chat
    # template), "none", or a format (edge_llm/server/tool_parsers.py, reasoning_parsers.py)
    tool_call_parser: str = "auto"
    reasoning_parser: str = "auto"

    def __post_init__(self) -> None:
        for name in ("max_prompts_per_request", "max_messages", "max_prompt_chars"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}.")
        for name in ("header_read_timeout", "body_read_timeout", "timeout_keep_alive"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)}.")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}.")
        if self.max_queue is not None and self.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {self.max_queue}.")
        if self.max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {self.max_body_bytes}.")
        if self.ready_timeout < 0:
            raise ValueError(f"ready_timeout must be >= 0 seconds, got {self.ready_timeout}.")
        if self.retry_after < 0:
            raise ValueError(f"retry_after must be >= 0 seconds, got {self.retry_after}.")
        if self.default_max_tokens is not None and self.default_max_tokens < 0:
            raise ValueError(f"default_max_tokens must be >= 0, got {self.default_max_tokens}.")
        tool_kinds = ("auto", "none", "hermes", "llama3_json")
        if self.tool_call_parser not in tool_kinds:
            raise ValueError(f"tool_call_parser must be one of {', '.join(tool_kinds)}, got "
                             f"{self.tool_call_parser!r}.")
        think_kinds = ("auto", "none", "deepseek_r1", "qwen3")
        if self.reasoning_parser not in think_kinds:
            raise ValueError(f"reasoning_parser must be one of {', '.join(think_kinds)}, got "
                             f"{self.reasoning_parser!r}.")
