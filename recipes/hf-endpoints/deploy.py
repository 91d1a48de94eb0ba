"""Deploy the edge-llm image as a Hugging Face Inference Endpoint (custom container).

    python recipes/hf-endpoints/deploy.py --image ghcr.io/OWNER/edge-llm:warm \
        --repository OWNER/MODEL-AWQ --vendor aws --region us-east-1 --instance nvidia-l4

The endpoint mounts the chosen model repository at /repository and sends traffic and health
checks to the container's port (8080 here) and health route (/health); scale to zero is
``min_replica=0`` with ``scale_to_zero_timeout`` minutes. Endpoints have no persistent disk:
the image should carry warmed compile caches (``recipes/warm-cache``).
"""

from __future__ import annotations

import argparse
from typing import Any

PORT = 8080  # the image runs as a non-root user: no port below 1024
HEALTH_ROUTE = "/health"
MODEL_DIR = "/repository"


def custom_image(image: str) -> dict[str, Any]:
    """The ``custom_image`` argument of ``huggingface_hub.create_inference_endpoint``."""
    return {"url": image, "health_route": HEALTH_ROUTE, "port": PORT}


def container_env() -> dict[str, str]:
    """The ``env`` argument: the mounted repository, the port, sleep when idle."""
    return {"EDGE_LLM_MODEL": MODEL_DIR, "PORT": str(PORT), "EDGE_LLM_HOST": "0.0.0.0",
            "EDGE_LLM_IDLE_SLEEP_S": "300"}


def endpoint_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """Every argument of the ``create_inference_endpoint`` call."""
    return dict(name=args.name, repository=args.repository, framework="pytorch",
                task="text-generation", accelerator="gpu", vendor=args.vendor,
                region=args.region, type="authenticated", instance_size=args.size,
                instance_type=args.instance, custom_image=custom_image(args.image),
                env=container_env(), min_replica=0, max_replica=1, scale_to_zero_timeout=15)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--image", required=True)
    parser.add_argument("--repository", required=True, help="the model repo to mount")
    parser.add_argument("--name", default="edge-llm")
    parser.add_argument("--vendor", default="aws")
    parser.add_argument("--region", default="us-east-1")
    parser.add_argument("--instance", default="nvidia-l4")
    parser.add_argument("--size", default="x1")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    from huggingface_hub import create_inference_endpoint

    endpoint = create_inference_endpoint(**endpoint_kwargs(parse_args(argv)))
    print(f"endpoint {endpoint.name}: {endpoint.url or 'starting'}")


if __name__ == "__main__":
    main()
