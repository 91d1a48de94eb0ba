"""Each deployment recipe's contract, exercised locally against one in-process server over the
fake engine: the RunPod handler called with job dicts (no runpod package), Modal's snapshot
hooks (no modal package), the probes and ports of the Cloud Run / KServe YAML, SageMaker's
/ping + /invocations on its port, and the HF Inference Endpoints image settings."""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
from pathlib import Path

import httpx
import pytest
import yaml

from edge_llm.cli import SERVE_OPTIONS, build_lifecycle, resolve_options
from edge_llm.config import EngineConfig, SchedulerConfig, ServerConfig
from edge_llm.server import create_app
from edge_llm.server.hooks import LifecycleConfig
from edge_llm.server.terminal_chat import ThreadedServer
from tests.test_lifecycle import SleepyEngine

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
WORDS = ["alpha", "river", "seven", "blue", "quiet", "lamp", "north", "Paris"]


def load(path: str):
    spec = importlib.util.spec_from_file_location(Path(path).stem + "_recipe", RECIPES / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def served(fake_tokenizer, module_rng):
    """(url, engine, scripts): the fake engine behind a real socket, SageMaker routes on."""
    rng = module_rng
    scripts = [fake_tokenizer.encode(" ".join(rng.choice(WORDS) for _ in range(10)))
               for _ in range(2)]
    engine = SleepyEngine(fake_tokenizer, scripts)
    app = create_app(EngineConfig(scheduler=SchedulerConfig(max_num_seqs=8)),
                     ServerConfig(log_requests=False, enable_sleep_endpoints=True),
                     engine_factory=lambda: engine,
                     lifecycle=LifecycleConfig(sagemaker=True, warmup=False))
    server = ThreadedServer(app)
    server.start()
    for _ in range(200):
        if httpx.get(server.url + "/health").status_code == 200:
            break
    yield server.url, engine, scripts
    server.stop()


def resolved_port(environ: dict[str, str]) -> argparse.Namespace:
    """The serve options the container's environment gives (as ``edge-llm serve`` sees it)."""
    args = argparse.Namespace(**{o.dest: None for o in SERVE_OPTIONS})
    args.port_given = any(environ.get(k) for k in ("EDGE_LLM_PORT", "PORT"))
    resolve_options(args, SERVE_OPTIONS, environ)
    args.lifecycle = build_lifecycle(args, environ)
    return args


def test_runpod_handler_streams_openai_chunks(served, monkeypatch, fake_tokenizer):
    url, _, scripts = served
    monkeypatch.setenv("EDGE_LLM_URL", url)
    handler = load("runpod/handler.py")
    n = random.randint(2, 6)
    chunks = list(handler.handler({"id": "job-1", "input": {
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": n, "stream": True}}))
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == fake_tokenizer.decode(scripts[0][:n])
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    (whole,) = handler.handler({"id": "job-2", "input": {"prompt": "Hi", "max_tokens": n}})
    assert whole["object"] == "text_completion"
    assert whole["usage"]["completion_tokens"] == n
    (err,) = handler.handler({"id": "job-3", "input": {"max_tokens": 2}})
    assert "messages" in err["error"]
    (err,) = handler.handler({"id": "job-4", "input": {"prompt": "Hi", "max_tokens": 0}})
    assert err["error"]["param"] == "max_tokens"


def test_modal_snapshot_hooks_sleep_then_wake(served):
    url, engine, _ = served
    snapshot = load("modal/snapshot.py")
    calls = len(engine.sleep_calls)
    assert snapshot.before_snapshot(url, timeout=30)["is_sleeping"] is True
    assert engine.sleep_calls[calls:] == [1]
    assert httpx.get(url + "/health").json()["error"]["code"] == "asleep"
    assert snapshot.after_restore(url, timeout=30) == {"is_sleeping": False, "changed": True}
    assert httpx.get(url + "/health").status_code == 200
    source = (RECIPES / "modal" / "app.py").read_text()
    assert "@modal.enter(snap=True)" in source and "@modal.enter(snap=False)" in source


def _probes(container: dict) -> dict[str, tuple[str, int]]:
    return {name: (p["httpGet"]["path"], p["httpGet"]["port"])
            for name, p in container.items() if name.endswith("Probe")}


def _check_probes(url: str, probes: dict[str, tuple[str, int]], port: int) -> None:
    """Every probe targets the serving port; readiness-like probes 503 while the engine
    sleeps, liveness stays 200 (or an idle replica would be restarted)."""
    assert probes and {p for _, p in probes.values()} == {port}
    for name, (path, _) in probes.items():
        assert httpx.get(url + path).status_code == 200, name
    assert httpx.post(url + "/sleep").status_code == 200
    try:
        for name, (path, _) in probes.items():
            expected = 200 if name == "livenessProbe" else 503
            assert httpx.get(url + path).status_code == expected, name
    finally:
        assert httpx.post(url + "/wake_up").status_code == 200


def test_cloud_run_service_probes_and_port(served):
    url = served[0]
    service = yaml.safe_load((RECIPES / "cloud-run" / "service.yaml").read_text())
    template = service["spec"]["template"]
    assert template["metadata"]["annotations"]["autoscaling.knative.dev/minScale"] == "0"
    (container,) = template["spec"]["containers"]
    port = container["ports"][0]["containerPort"]
    assert port == 8080
    env = {e["name"]: e["value"] for e in container.get("env", [])}
    args = resolved_port({**env, "PORT": str(port)})  # Cloud Run sets PORT to containerPort
    assert args.port == port and args.lifecycle.idle_sleep_s == float(env["EDGE_LLM_IDLE_SLEEP_S"])
    _check_probes(url, _probes(container), port)


def test_kserve_inferenceservice_scales_to_zero_and_probes(served):
    url = served[0]
    isvc = yaml.safe_load((RECIPES / "kserve" / "inferenceservice.yaml").read_text())
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1"
    predictor = isvc["spec"]["predictor"]
    assert predictor["minReplicas"] == 0
    (container,) = predictor["containers"]
    port = container["ports"][0]["containerPort"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert resolved_port(env).port == port and env["EDGE_LLM_MODEL"] == "/mnt/models"
    _check_probes(url, _probes(container), port)


def test_sagemaker_env_port_ping_and_invocations(served, fake_tokenizer):
    url, _, scripts = served
    deploy = load("sagemaker/deploy.py")
    env = deploy.container_env(idle_sleep_s=60)
    assert all(isinstance(v, str) for v in env.values())
    args = resolved_port(env)
    assert args.lifecycle.sagemaker and args.port == deploy.PORT == 8080
    assert resolved_port({"SAGEMAKER_BIND_TO_PORT": "9001"}).port == 9001
    assert httpx.get(url + "/ping").status_code == 200
    n = random.randint(2, 5)
    r = httpx.post(url + "/invocations", json={
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": n})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == fake_tokenizer.decode(scripts[0][:n])
    r = httpx.post(url + "/invocations", content=json.dumps({"prompt": "Hi", "max_tokens": n}))
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == n


def test_hf_endpoints_custom_image_settings(served):
    url = served[0]
    deploy = load("hf-endpoints/deploy.py")
    image = deploy.custom_image("ghcr.io/owner/edge-llm:1")
    assert image["env"]["EDGE_LLM_MODEL"] == "/repository"
    args = resolved_port(image["env"])
    assert args.port == image["port"] and args.host == "0.0.0.0"
    assert httpx.get(url + image["health_route"]).status_code == 200


def test_every_recipe_has_a_readme_with_commands_and_a_cited_contract():
    for name in ("runpod", "modal", "cloud-run", "sagemaker", "kserve", "hf-endpoints"):
        text = (RECIPES / name / "README.md").read_text()
        assert "```" in text and "https://" in text, name
