"""Deploy the edge-llm image as a Hugging Face Inference Endpoint (custom container).

    python recipes/hf-endpoints/deploy.py --image ghcr.io/OWNER/edge-llm:warm \
        --repository OWNER/MODEL-AWQ --vendor aws --region us-east-1 --instance nvidia-l4

The endpoint mounts the chosen model repository at /repository and sends traffic and health
checks to the container's port (8080 here) and health route (/health); scale to zero is
``min_replica=0`` with ``scale_to_zero_timeout`` minutes, and up to ``--max-replicas`` replicas
on pending requests per replica (docs/scaling.md's sizing: each replica runs ``MAX_NUM_SEQS``
requests at once and a new one is added at ``SCALE_TARGET`` pending; GPU utilisation, the
platform's default signal, reads high at any load on a batching server). Endpoints have no
persistent disk: the image should carry warmed compile caches (``recipes/warm-cache``).
"""

from __future__ import annotations

import argparse
from typing import Any

PORT = 8080  # the image runs as a non-root user: no port below 1024
HEALTH_ROUTE = "/health"
MODEL_DIR = "/repository"
MAX_NUM_SEQS = 32  # C: one replica's concurrency (BENCHMARKS.md's serving table)
SCALE_TARGET = 24  # T = 0.75 C: pending requests per replica at which to add one


def custom_image(image: str) -> dict[str, Any]:
    """The ``custom_image`` argument of ``huggingface_hub.create_inference_endpoint``."""
    return {"url": image, "health_route": HEALTH_ROUTE, "port": PORT}


def container_env() -> dict[str, str]:
    """The ``env`` argument: the mounted repository, the port, sleep when idle."""
    return {"EDGE_LLM_MODEL": MODEL_DIR, "PORT": str(PORT), "EDGE_LLM_HOST": "0.0.0.0",
            "EDGE_LLM_IDLE_SLEEP_S": "300", "EDGE_LLM_MAX_NUM_SEQS": str(MAX_NUM_SEQS),
            "EDGE_LLM_MAX_QUEUE": str(2 * MAX_NUM_SEQS)}


def endpoint_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """Every argument of the ``create_inference_endpoint`` call."""
    return dict(name=args.name, repository=args.repository, framework="pytorch",
                task="text-generation", accelerator="gpu", vendor=args.vendor,
                region=args.region, type="authenticated", instance_size=args.size,
                instance_type=args.instance, custom_image=custom_image(args.image),
                env=container_env(), min_replica=0, max_replica=args.max_replicas,
                scaling_metric="pendingRequests", scaling_threshold=float(SCALE_TARGET),
                scale_to_zero_timeout=15)


def _positive(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--image", required=True)
    parser.add_argument("--repository", required=True, help="the model repo to mount")
    parser.add_argument("--name", default="edge-llm")
    parser.add_argument("--vendor", default="aws")
    parser.add_argument("--region", default="us-east-1")
    parser.add_argument("--instance", default="nvidia-l4")
    parser.add_argument("--size", default="x1")
    parser.add_argument("--max-replicas", type=_positive, default=4,
                        help="most replicas (GPUs) to scale out to (default: 4)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    from huggingface_hub import create_inference_endpoint

    endpoint = create_inference_endpoint(**endpoint_kwargs(parse_args(argv)))
    print(f"endpoint {endpoint.name}: {endpoint.url or 'starting'}")


if __name__ == "__main__":
    main()
