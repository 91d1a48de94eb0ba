"""``edge-llm`` command line: flags and environment, exit codes, one-line errors, chat."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edge_llm import cli

ENV = {k: v for k, v in os.environ.items() if not k.startswith("EDGE_LLM_")
       or k == "EDGE_LLM_CACHE_DIR"}


def run_cli(*args: str, stdin: str = "", env: dict | None = None, timeout: float = 120
            ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edge_llm.cli", *args], input=stdin,
                          capture_output=True, text=True, timeout=timeout,
                          env={**ENV, **(env or {})})


def serve_args(argv: list[str], environ: dict[str, str]) -> argparse.Namespace:
    args = cli.build_parser().parse_args(["serve", *argv])
    cli.resolve_options(args, cli.SERVE_OPTIONS, environ)
    return args


@pytest.mark.parametrize("argv, needle", [
    (["serve", "--port", "eighty"], "--port"),
    (["serve", "--no-such-flag"], "--no-such-flag"),
    (["serve", "--block-size", "7"], "block_size"),
    (["serve", "--gpu-memory-utilization", "1.5"], "gpu_memory_utilization"),
    (["serve", "--kv-cache-memory", "lots"], "--kv-cache-memory"),
    (["serve", "--max-tokens-with-decodes", "-5"], "--max-tokens-with-decodes"),
    (["chat", "--max-tokens", "0"], "--max-tokens"),
    (["frobnicate"], "frobnicate"),
])
def test_bad_flags_exit_2_with_one_line(argv, needle):
    res = run_cli(*argv)
    assert res.returncode == 2, res
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in res.stderr


def test_bad_values_are_named_plainly():
    """argparse names the value's kind, not our parser function."""
    for argv, kind in ((["--max-tokens-with-decodes", "lots"], "invalid token count value"),
                       (["--kv-cache-memory", "lots"], "invalid size value"),
                       (["--cuda-graph-sizes", "a,b"], "invalid integer list value")):
        res = run_cli("serve", *argv)
        assert res.returncode == 2 and kind in res.stderr and "parse_" not in res.stderr, res


def test_bad_environment_value_exits_2():
    res = run_cli("serve", env={"EDGE_LLM_MAX_NUM_SEQS": "many"})
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "edge-llm serve: error: environment variable EDGE_LLM_MAX_NUM_SEQS: invalid literal "
        "for int() with base 10: 'many'"]


def test_bad_kernels_choice_exits_2():
    res = run_cli("serve", env={"EDGE_LLM_KERNELS": "cuda"})
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "edge-llm serve: error: EDGE_LLM_KERNELS must be triton or torch, got 'cuda'."]


def test_bad_probe_cache_switch_exits_2():
    res = run_cli("serve", env={"EDGE_LLM_PROBE_CACHE": "no"})
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "edge-llm serve: error: EDGE_LLM_PROBE_CACHE must be 0 or 1, got 'no'."]


def test_missing_model_folder_exits_1_without_traceback(tmp_path):
    missing = tmp_path / "no" / "such-model"
    res = run_cli("serve", str(missing), "--port", "0")
    assert res.returncode == 1
    assert res.stderr.strip() == f"edge-llm serve: error: model folder not found: {missing}"
    not_model = tmp_path / "empty"
    not_model.mkdir()
    res = run_cli("chat", str(not_model))
    assert res.returncode == 1 and "no config.json" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_model_that_fails_to_load_exits_1(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["NoSuchForCausalLM"]}')
    res = run_cli("serve", str(tmp_path), "--port", "0", "--log-level", "error", timeout=300)
    assert res.returncode == 1
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("edge-llm serve: error: the model failed to load:")
    assert "Traceback" not in res.stderr


def test_flags_win_over_env_which_wins_over_defaults():
    env = {"EDGE_LLM_PORT": "9001", "PORT": "9100", "EDGE_LLM_MAX_NUM_SEQS": "7",
           "EDGE_LLM_ENABLE_PREFIX_CACHING": "false", "EDGE_LLM_API_KEY": "k-env"}
    args = serve_args(["--max-num-seqs", "3", "--kv-cache-memory", "2GiB"], env)
    assert (args.port, args.max_num_seqs, args.enable_prefix_caching) == (9001, 3, False)
    assert args.api_key == "k-env" and args.kv_cache_memory == 2 * 1024**3
    assert serve_args([], {"PORT": "9100"}).port == 9100
    args = serve_args(["--enable-prefix-caching", "--port", "9002"], env)
    assert (args.port, args.enable_prefix_caching) == (9002, True)
    defaults = serve_args([], {})
    assert (defaults.host, defaults.port, defaults.block_size, defaults.max_queue) == (
        "127.0.0.1", 8000, 16, None)


def test_build_configs_maps_every_engine_flag(tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages[0]['content'] }}")
    args = serve_args([
        "--dtype", "float16", "--device", "cpu", "--max-model-len", "512", "--block-size", "32",
        "--gpu-memory-utilization", "0.5", "--kv-cache-memory", "123456", "--swap-space", "1.5",
        "--kv-cache-dtype", "fp8",
        "--no-enable-prefix-caching", "--max-num-seqs", "5", "--max-num-batched-tokens", "256",
        "--growth-reserve", "32", "--preemption-mode", "swap", "--seed", "9", "--enforce-eager",
        "--max-tokens-with-decodes", "300",
        "--disable-async-output-proc", "--disable-decode-run-ahead",
        "--cuda-graph-sizes", "8,1,4",
        "--chat-template", str(template),
        "--served-model-name", "m", "--api-key", "k", "--max-queue", "4", "--host", "0.0.0.0",
    ], {})
    args.model = None
    engine, server = cli.build_configs(args)
    assert (engine.model.dtype, engine.model.device, engine.model.max_model_len,
            engine.model.seed, engine.model.chat_template) == (
        "float16", "cpu", 512, 9, str(template))
    assert (engine.cache.block_size, engine.cache.gpu_memory_utilization,
            engine.cache.kv_cache_memory, engine.cache.swap_space,
            engine.cache.enable_prefix_caching, engine.cache.kv_cache_dtype) == (
        32, 0.5, 123456, 1.5, False, "fp8")
    assert (engine.scheduler.max_num_seqs, engine.scheduler.max_num_batched_tokens,
            engine.scheduler.growth_reserve, engine.scheduler.preemption_mode) == (5, 256, 32,
                                                                               "swap")
    assert engine.scheduler.max_tokens_with_decodes == 300
    assert engine.enforce_eager is True
    assert engine.cuda_graph_sizes == (1, 4, 8)
    assert engine.async_output_proc is False and engine.decode_run_ahead is False
    plain = serve_args([], {})
    plain.model = None
    assert cli.build_configs(plain)[0].async_output_proc is None  # auto: on a GPU
    assert cli.build_configs(plain)[0].decode_run_ahead is None
    # no cap on steps with decodes unless asked for (it cost 10-14% throughput on the H200)
    assert cli.build_configs(plain)[0].scheduler.max_tokens_with_decodes == 0
    for text, want in (("0", 0), ("none", 0), ("NONE", 0), ("auto", "auto"), ("96", 96)):
        args = serve_args([], {"EDGE_LLM_MAX_TOKENS_WITH_DECODES": text})
        args.model = None
        assert cli.build_configs(args)[0].scheduler.max_tokens_with_decodes == want
    assert (server.host, server.api_key, server.served_model_name, server.max_queue) == (
        "0.0.0.0", "k", "m", 4)


def test_subcommand_plugins_are_discovered(tmp_path, monkeypatch):
    import edge_llm

    plugin_dir = tmp_path / "edge_llm"
    plugin_dir.mkdir()
    (plugin_dir / "cli_hello.py").write_text(
        "def register(subs):\n"
        "    p = subs.add_parser('hello')\n"
        "    p.add_argument('--name', default='x')\n"
        "    p.set_defaults(func=lambda args: print('hello', args.name) or 0)\n")
    monkeypatch.setattr(edge_llm, "__path__", [*edge_llm.__path__, str(plugin_dir)])
    monkeypatch.delitem(sys.modules, "edge_llm.cli_hello", raising=False)
    assert cli.main(["hello", "--name", "bench"]) == 0


def test_chat_with_url_streams_and_keeps_history(live_server):
    script = "What is the capital of France?\n/reset\n/bogus\nAnd of Italy?\n/exit\nnot read\n"
    res = run_cli("chat", "--url", live_server.url, "--max-tokens", "10",
                  "--temperature", "0", stdin=script)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "Paris" in out and "(history cleared)" in out and "Unknown command" in out
    assert out.count("> ") >= 4 and "not read" not in out


def test_chat_eof_exits_cleanly_and_unreachable_url_fails(live_server):
    res = run_cli("chat", "--url", live_server.url + "/v1", "--max-tokens", "3",
                  stdin="Hello")
    assert res.returncode == 0 and res.stderr == ""
    res = run_cli("chat", "--url", "http://127.0.0.1:9", stdin="")
    assert res.returncode == 1 and "cannot reach" in res.stderr


def test_chat_in_process_with_model_folder(live_server):
    from edge_llm.model.demo import ensure_demo_model

    folder = Path(ensure_demo_model())  # prepared by the live server already
    res = run_cli("chat", str(folder), "--max-model-len", "256", "--max-tokens", "2",
                  "--temperature", "0", stdin="Hi\n", timeout=300)
    assert res.returncode == 0, res.stderr
    assert "Chatting with SmolLM2-135M-Instruct-AWQ" in res.stdout


def test_check_model_path_accepts_folders_and_hub_ids(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    cli.check_model_path(str(tmp_path))
    cli.check_model_path("TheBloke/Llama-2-7B-AWQ")  # left to the loader
    cli.check_model_path(None)  # the demo model
    for bad in ("./missing-folder", "no-slash-name", str(tmp_path / "config.json")):
        with pytest.raises(cli.RunError):
            cli.check_model_path(bad)


def test_cuda_graph_sizes_bad_values_are_usage_errors():
    from edge_llm.flags import parse_int_list

    with pytest.raises(ValueError, match="comma-separated integers"):
        parse_int_list("1,x")
    for bad in ("0,4", "1024"):
        args = serve_args(["--cuda-graph-sizes", bad], {})
        args.model = None
        with pytest.raises(cli.UsageError, match="cuda_graph_sizes"):
            cli.build_configs(args)
