"""The Hugging Face Inference Endpoints recipe against ``huggingface_hub`` itself: the
deploy script's call bound to the installed ``create_inference_endpoint`` signature with the
library's own enum for the endpoint type, the README's CLI (``hf``, the 1.0 name) and
cold-start header, and the container settings resolved as ``edge-llm serve`` resolves them."""

from __future__ import annotations

import inspect
import subprocess
import sys

import httpx
import huggingface_hub
import pytest

from tests.recipe_fixtures import (  # noqa: F401
    DEFAULT_MAX_REPLICAS,
    REPLICA_CONCURRENCY,
    SCALE_TARGET,
    image_env,
    load,
    readme_commands,
    resolved,
    served,
)


def test_deploy_call_binds_to_the_hub_signature(monkeypatch, capsys):
    from huggingface_hub import InferenceEndpointType

    deploy = load("hf-endpoints/deploy.py")
    real = inspect.signature(huggingface_hub.create_inference_endpoint)
    calls = []

    def fake(*args, **kwargs):
        calls.append(real.bind(*args, **kwargs))  # TypeError on a missing or unknown argument
        return type("Endpoint", (), {"name": kwargs["name"], "url": None})()

    monkeypatch.setattr(huggingface_hub, "create_inference_endpoint", fake)
    deploy.main(["--image", "ghcr.io/owner/edge-llm:warm", "--repository", "owner/model-AWQ"])
    (bound,) = calls
    kw = dict(bound.arguments)
    InferenceEndpointType(kw["type"])  # ValueError on a type the API does not have
    assert kw["min_replica"] == 0 and kw["scale_to_zero_timeout"] > 0
    assert kw["custom_image"]["url"] == "ghcr.io/owner/edge-llm:warm"
    assert kw["custom_image"]["health_route"] == "/health"
    assert "endpoint edge-llm" in capsys.readouterr().out
    # 0..N replicas on pending requests per replica, below what one replica runs at once
    from huggingface_hub._inference_endpoints import InferenceEndpointScalingMetric

    assert kw["max_replica"] == DEFAULT_MAX_REPLICAS > 1
    assert InferenceEndpointScalingMetric(kw["scaling_metric"]).value == "pendingRequests"
    args = resolved(image_env() | kw["env"])
    assert kw["scaling_threshold"] == SCALE_TARGET < args.max_num_seqs == REPLICA_CONCURRENCY
    assert args.max_queue is not None and args.max_queue >= args.max_num_seqs
    deploy.main(["--image", "i", "--repository", "r", "--max-replicas", "8"])
    assert calls[-1].arguments["max_replica"] == 8
    with pytest.raises(SystemExit):
        deploy.parse_args(["--image", "i", "--repository", "r", "--max-replicas", "0"])


def test_container_settings(served):  # noqa: F811
    url = served[0]
    deploy = load("hf-endpoints/deploy.py")
    env = image_env() | deploy.container_env()
    assert env["EDGE_LLM_MODEL"] == "/repository"
    args = resolved(env)
    assert args.port == deploy.custom_image("x")["port"] and args.host == "0.0.0.0"
    assert httpx.get(url + deploy.HEALTH_ROUTE).status_code == 200


def test_readme_commands():
    assert not readme_commands("hf-endpoints", "huggingface-cli")  # removed in hub 1.0
    (login,) = readme_commands("hf-endpoints", "hf")
    assert login[1:] == ["auth", "login"]
    (curl,) = readme_commands("hf-endpoints", "curl")
    headers = [curl[i + 1] for i, a in enumerate(curl) if a == "-H"]
    timeout = [h for h in headers if h.lower().startswith("x-scale-up-timeout:")]
    assert timeout and int(timeout[0].split(":")[1]) > 0
    (run,) = [c for c in readme_commands("hf-endpoints", "python") if "deploy.py" in c[1]]
    load("hf-endpoints/deploy.py").parse_args(run[2:])  # the README's flags parse
    # the installed `hf` knows the command (huggingface_hub's console script, in-process)
    r = subprocess.run([sys.executable, "-c", "from huggingface_hub.cli.hf import main; main()",
                        *login[1:], "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "auth login [OPTIONS]" in r.stdout, r.stdout + r.stderr
