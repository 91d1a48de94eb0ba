"""What every deployment recipe owes its reader; each platform's own checks live in
tests/test_recipe_<platform>.py (RunPod, Modal, SageMaker, HF Endpoints) and
tests/test_recipe_manifests.py (Cloud Run, KServe)."""

from __future__ import annotations

import re

from tests.recipe_fixtures import RECIPES, REPLICA_CONCURRENCY, ROOT, SCALE_TARGET

PLATFORMS = ("runpod", "modal", "cloud-run", "sagemaker", "kserve", "hf-endpoints")
# where each recipe keeps the Triton kernels and start-up probes across cold starts
CACHE_HOMES = {"runpod": "network volume", "modal": "volume", "cloud-run": "Cloud Storage volume",
               "sagemaker": "warm-cache", "kserve": "PersistentVolumeClaim",
               "hf-endpoints": "warm-cache"}


def test_every_recipe_has_commands_a_cited_contract_and_a_cache_home():
    for name in PLATFORMS:
        text = (RECIPES / name / "README.md").read_text()
        assert "```bash" in text and "https://" in text, name
        assert "**Caches**" in text, f"{name}: where do the caches live?"
        assert CACHE_HOMES[name] in text, name
        for test in re.findall(r"pytest -q (tests/\S+\.py)", text):
            assert (ROOT / test).is_file(), f"{name}: {test} does not exist"


def test_readmes_point_at_existing_files():
    for readme in RECIPES.glob("*/README.md"):
        for path in re.findall(r"(recipes/[\w./-]+\.(?:py|yaml|md)|recipes/[\w-]+/Dockerfile)",
                               readme.read_text()):
            assert (ROOT / path).exists(), f"{readme}: {path}"


def test_every_recipe_says_how_it_scales_and_where_the_numbers_come_from():
    for name in PLATFORMS:
        text = (RECIPES / name / "README.md").read_text()
        assert re.search(r"(\*\*|## )Scaling", text), f"{name}: no Scaling paragraph"
        assert "(../../docs/scaling.md)" in text, f"{name}: the sizing's source is not linked"
        for number in (REPLICA_CONCURRENCY, SCALE_TARGET):
            assert re.search(rf"\b{number}\b", text), f"{name}: {number} not stated"
    sizing = (ROOT / "docs" / "scaling.md").read_text()
    assert f"| {REPLICA_CONCURRENCY}:" in sizing and f"| {SCALE_TARGET} (75 % of C)" in sizing
