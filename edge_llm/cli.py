"""``edge-llm`` command line: one argparse subcommand per function pair.

Each subcommand is ``add_<name>_arguments(parser)`` plus ``run_<name>(args) -> exit code``.
Other parts add theirs without editing this file: a module ``edge_llm/cli_<name>.py`` defining
``register(subparsers)`` (which adds a parser and sets ``func=run``) is picked up at start.

Settings: a flag wins over its ``EDGE_LLM_*`` environment variable, which wins over the default
(``PORT`` is honoured after ``EDGE_LLM_PORT``; the flag table is edge_llm/flags.py). Exit
codes: 0 ok, 1 runtime failure (e.g. a missing model folder), 2 bad flags or values; errors
are one line, no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

from edge_llm import envs
from edge_llm.flags import (  # re-exported: recipes and plugins import them from here
    SERVE_OPTIONS,
    UsageError,
    add_options,
    environment_help,
    option_env,
    resolve_options,
)

PROG = "edge-llm"



class RunError(Exception):
    """A failure at run time (missing model folder...): one line on stderr, exit code 1."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage dump) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


# ---- serve --------------------------------------------------------------------------------


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", default=None,
                        help="model folder or hub id [env $EDGE_LLM_MODEL; default: the "
                             "built-in demo model]")
    add_options(parser, SERVE_OPTIONS)


def check_model_path(model: str | None) -> None:
    """A local model must be a folder with config.json; a hub id (org/name) is left to the
    loader. Raises RunError naming the path."""
    if model is None:
        return
    path = Path(model).expanduser()
    if path.exists():
        if not path.is_dir():
            raise RunError(f"model is not a folder: {model}")
        if not (path / "config.json").is_file() and not any(path.glob("*.gguf")):
            raise RunError(f"model folder has no config.json: {model}")
        return
    hub_id = re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", model) is not None
    if not hub_id or model.startswith((".", "~")):
        raise RunError(f"model folder not found: {model}")


def build_configs(args: argparse.Namespace) -> tuple[Any, Any]:
    """(EngineConfig, ServerConfig) from resolved serve options; UsageError on bad values."""
    from edge_llm.config import (
        CacheConfig,
        EngineConfig,
        ModelConfig,
        SchedulerConfig,
        ServerConfig,
    )

    try:
        engine = EngineConfig(
            model=ModelConfig(model=args.model, dtype=args.dtype, device=args.device,
                              max_model_len=args.max_model_len, seed=args.seed,
                              chat_template=args.chat_template),
            cache=CacheConfig(block_size=args.block_size,
                              gpu_memory_utilization=args.gpu_memory_utilization,
                              kv_cache_memory=args.kv_cache_memory, swap_space=args.swap_space,
                              enable_prefix_caching=args.enable_prefix_caching,
                              kv_cache_dtype=args.kv_cache_dtype),
            scheduler=SchedulerConfig(max_num_seqs=args.max_num_seqs,
                                      max_num_batched_tokens=args.max_num_batched_tokens,
                                      growth_reserve=args.growth_reserve,
                                      preemption_mode=args.preemption_mode,
                                      max_tokens_with_decodes=args.max_tokens_with_decodes),
            enforce_eager=args.enforce_eager,
            cuda_graph_sizes=args.cuda_graph_sizes,
            async_output_proc=False if args.disable_async_output_proc else None,
            decode_run_ahead=False if args.disable_decode_run_ahead else None,
        )
        server = ServerConfig(host=args.host, port=args.port, api_key=args.api_key,
                              served_model_name=args.served_model_name,
                              max_queue=args.max_queue, chat_template=args.chat_template,
                              log_requests=args.log_requests, ready_timeout=args.ready_timeout,
                              allowed_origins=args.allowed_origins,
                              allowed_methods=args.allowed_methods,
                              allowed_headers=args.allowed_headers,
                              allow_credentials=args.allow_credentials,
                              allowed_hosts=args.allowed_hosts,
                              enable_sleep_endpoints=args.enable_sleep_endpoints,
                              max_prompts_per_request=args.max_prompts_per_request,
                              max_messages=args.max_messages,
                              max_prompt_chars=args.max_prompt_chars,
                              header_read_timeout=args.header_read_timeout,
                              body_read_timeout=args.body_read_timeout,
                              timeout_keep_alive=args.timeout_keep_alive,
                              default_max_tokens=args.default_max_tokens,
                              generation_config=args.generation_config,
                              tool_call_parser=args.tool_call_parser,
                              reasoning_parser=args.reasoning_parser)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return engine, server


def check_generation_config(spec: str) -> None:
    """``--generation-config PATH``: the file exists and holds valid defaults (``auto`` is read
    once the model is found). UsageError naming the file otherwise."""
    if spec in ("auto", "vllm"):
        return
    from edge_llm.server.request_defaults import generation_config_file, read_generation_config

    try:
        path = generation_config_file(spec, None)
        if path is not None:
            read_generation_config(path)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def build_lifecycle(args: argparse.Namespace, environ: dict[str, str] | None = None) -> Any:
    """LifecycleConfig from resolved serve options; SageMaker's environment turns on its mode
    and picks its port (``SAGEMAKER_BIND_TO_PORT``, default 8080) unless a port was given.
    UsageError naming the flag or file on bad values."""
    from edge_llm.server.hooks import LifecycleConfig, read_warmup_prompts

    sagemaker = args.sagemaker or envs.SAGEMAKER_BIND_TO_PORT.is_set(environ) or \
        envs.SM_MODEL_DIR.is_set(environ)
    if sagemaker and not args.port_given:
        try:
            args.port = envs.SAGEMAKER_BIND_TO_PORT.get(environ) or 8080
        except ValueError:
            raise UsageError("environment variable SAGEMAKER_BIND_TO_PORT: not a port") from None
        args.host = "0.0.0.0" if args.host == "127.0.0.1" else args.host
    prompts: tuple = ()
    if args.warmup_prompts:
        try:
            prompts = read_warmup_prompts(args.warmup_prompts)
        except ValueError as exc:
            raise UsageError(f"--warmup-prompts: {exc}") from None
    hooks = tuple(h.strip() for h in (args.hook or "").split(",") if h.strip())
    try:
        return LifecycleConfig(idle_sleep_s=args.idle_sleep_s, sleep_level=args.sleep_level,
                               warmup=args.warmup, warmup_prompts=prompts, hooks=hooks,
                               drain_timeout=args.drain_timeout, sagemaker=sagemaker,
                               freeze_gc=True)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def setup_logging(level: str) -> None:
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise UsageError(f"--log-level must be debug, info, warning or error, got {level!r}")
    logging.basicConfig(level=numeric, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def prepare_serve(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """What ``serve`` (and ``warmup``) do before the server loads: the compile caches' place,
    the settings checked (UsageError / RunError), logging, then the device preparation and
    the checkpoint prefetch started. Returns (EngineConfig, ServerConfig, LifecycleConfig)."""
    from edge_llm.engine.device_prep import start_device_prep
    from edge_llm.model.prefetch import start_prefetch
    from edge_llm.server.hooks import set_compile_cache_env

    set_compile_cache_env()  # before torch/triton load: a second cold start reuses kernels
    args.port_given = args.port is not None or option_env("--port") is not None
    resolve_options(args, SERVE_OPTIONS)
    args.model = args.model or envs.MODEL.get()
    engine_cfg, server_cfg = build_configs(args)
    lifecycle = build_lifecycle(args)
    server_cfg = replace(server_cfg, host=args.host, port=args.port)
    check_generation_config(args.generation_config)
    setup_logging(args.log_level)
    check_model_path(args.model)
    try:
        envs.check_all()  # every declared variable's value, before anything loads
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    # the CUDA context and Triton's key, then the checkpoint into the page cache, on their
    # own threads while the server and torch are imported
    start_device_prep(engine_cfg.model.device)
    start_prefetch(args.model, engine_cfg.model.revision,
                   compile_cache=envs.TRITON_CACHE_DIR.get())
    return engine_cfg, server_cfg, lifecycle


def run_serve(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT: then new requests get 503 (or a refused connection), those
    in flight get ``--drain-timeout`` seconds to finish, and the exit code is 0."""
    started = time.time()
    engine_cfg, server_cfg, lifecycle = prepare_serve(args)
    failures: list[BaseException] = []
    server: Any = None

    def stop(exc: BaseException) -> None:  # the model failed to load: exit 1
        failures.append(exc)
        if server is not None:
            server.should_exit = True

    import uvicorn

    from edge_llm.server import create_app
    from edge_llm.server.draining import DrainingServer
    from edge_llm.server.slow_clients import header_deadline_protocol

    try:
        app = create_app(engine_cfg, server_cfg, on_load_failure=stop, lifecycle=lifecycle)
    except (ValueError, OSError) as exc:
        raise RunError(str(exc)) from None
    logging.getLogger("edge_llm.server").info(
        "startup phase server_import: %.2f s (process start to app built: %.2f s)",
        time.time() - started, time.time() - app.state.ctx.holder.phases.process_start)
    config = uvicorn.Config(app, host=server_cfg.host, port=server_cfg.port,
                            log_level=args.log_level, access_log=False, log_config=None,
                            http=header_deadline_protocol(server_cfg.header_read_timeout),
                            timeout_keep_alive=server_cfg.timeout_keep_alive)
    server = DrainingServer(config, app.state.ctx.holder, lifecycle.drain_timeout)
    server.run()
    if failures:
        raise RunError(f"the model failed to load: {failures[0]}")
    return 0 if server.started else 1


# ---- chat ---------------------------------------------------------------------------------


def add_chat_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", default=None,
                        help="model folder or hub id to run in process (default: the demo "
                             "model); ignored with --url")
    parser.add_argument("--url", default=None,
                        help="an OpenAI-compatible server, e.g. http://127.0.0.1:8000")
    parser.add_argument("--api-key", default=None, help="API key [env $EDGE_LLM_API_KEY]")
    parser.add_argument("--system", default=None, help="system prompt (default: none)")
    parser.add_argument("--temperature", type=float, default=0.7,
                        help="sampling temperature (default: 0.7)")
    parser.add_argument("--max-tokens", type=int, default=512,
                        help="most tokens per reply (default: 512)")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="context length of the in-process model (default: the model's)")
    parser.add_argument("--device", default="auto",
                        help="device of the in-process model: cuda, cpu or auto (default: auto)")


def run_chat(args: argparse.Namespace) -> int:
    from edge_llm.server.terminal_chat import ChatSettings, chat_in_process, chat_with_url

    settings = ChatSettings(
        api_key=args.api_key or option_env("--api-key"),
        system=args.system, temperature=args.temperature, max_tokens=args.max_tokens,
    )
    if args.max_tokens < 1:
        raise UsageError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    if args.url:
        return chat_with_url(args.url, settings)
    check_model_path(args.model)
    return chat_in_process(args.model, settings, max_model_len=args.max_model_len,
                           device=args.device)


# ---- main ---------------------------------------------------------------------------------


def _epilog() -> str:
    """The environment variables: each serve flag's, then those without a flag."""
    return (
        "environment variables of `edge-llm serve` (a flag given on the command line wins; "
        "`edge-llm serve --help` shows each default):\n"
        f"{environment_help(SERVE_OPTIONS)}\n"
        f"  {'EDGE_LLM_API_KEY':<44} also the key of `edge-llm chat --url`\n\n"
        f"{envs.help_text()}\n"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Serve 4-bit LLMs behind an OpenAI-compatible API.",
                     epilog=_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=_version())
    subs = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    serve = subs.add_parser("serve", help="run the OpenAI-compatible HTTP server")
    add_serve_arguments(serve)
    serve.set_defaults(func=run_serve)
    chat = subs.add_parser("chat", help="chat in the terminal (in process or with --url)")
    add_chat_arguments(chat)
    chat.set_defaults(func=run_chat)
    for module in _plugin_modules():
        module.register(subs)
    return parser


def _plugin_modules() -> list[Any]:
    """``edge_llm/cli_<name>.py`` modules with a ``register(subparsers)`` function."""
    import edge_llm

    found = []
    for info in sorted(pkgutil.iter_modules(edge_llm.__path__), key=lambda i: i.name):
        if info.name.startswith("cli_"):
            module = importlib.import_module(f"edge_llm.{info.name}")
            if callable(getattr(module, "register", None)):
                found.append(module)
    return found


def _version() -> str:
    from edge_llm import __version__

    return f"{PROG} {__version__}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except RunError as exc:
        print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    # run the importable module's main: plug-ins raise edge_llm.cli's error classes, which
    # are not this __main__ copy's
    from edge_llm.cli import main as _main

    sys.exit(_main())
