"""The Dockerfile built and run for real, with Debian's podman and no container registry.

The base image is a Debian rootfs made by ``mmdebstrap`` from Debian packages and imported
into podman (production builds keep the public CUDA base): it carries a uid-1000 user as
Ubuntu 24.04's ``ubuntu`` does, so a ``useradd --uid 1000`` collision fails here too. torch
is this machine's CPU wheel, found the way pip here finds it (``pip config``: find-links,
local indexes, CA bundle), fed to the build as pip's build arguments with the paths mounted
read-only. The container serves the demo model, shared read-only from this machine's cache
(no minutes of quantizing), through a published port: ``/health`` 200, one chat completion
with the official ``openai`` client, then SIGTERM and exit code 0. The image size is printed.

Podman runs as root on a VM without systemd: cgroupfs, file events, and, where the kernel
refuses raising resource limits or crun refuses hybrid cgroups, runc with limits below the
hard ones. The test skips (with the reason) only when podman cannot run a container at all.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT = 900  # seconds for mmdebstrap + build on a 2-core CI machine, cold
RUN_TIMEOUT = 300  # seconds from `podman run` to /health 200
# What the base image holds; its hash names the imported image, so a changed recipe rebuilds.
BASE_SUITE = "bookworm"  # python3.11: this machine's cp311 torch wheel installs in it
BASE_PACKAGES = ["python3", "python3-venv", "python3-dev", "gcc", "libc6-dev",
                 "ca-certificates"]
# Ubuntu 24.04 images ship `ubuntu` as uid 1000; so does this base
BASE_HOOK = 'chroot "$1" useradd --uid 1000 --create-home ubuntu'
BASE_TAG = "localhost/edge-llm-test-base:" + hashlib.sha256(
    json.dumps([BASE_SUITE, BASE_PACKAGES, BASE_HOOK]).encode()).hexdigest()[:12]
IMAGE_TAG = "localhost/edge-llm:test"

pytestmark = pytest.mark.slow


def _run(cmd: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def _hard_limit(resource_name: str) -> int:
    import resource

    return resource.getrlimit(getattr(resource, resource_name))[1]


def podman_flags() -> tuple[list[str], list[str]]:
    """(global flags, container flags) with which podman runs a container here."""
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (apt-get install podman buildah mmdebstrap)")
    base = ["podman", "--cgroup-manager", "cgroupfs", "--events-backend", "file"]
    nofile = min(_hard_limit("RLIMIT_NOFILE"), 65536)
    tries = [(base, []),
             (base + ["--runtime", "runc"],
              ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", "nproc=8192:8192"])]
    errors = []
    for glob, cont in tries:
        if glob[-1] == "runc" and shutil.which("runc") is None:
            errors.append("runc: not installed")
            continue
        r = _run(glob + ["run", "--rm", "--network", "none", *cont, BASE_TAG, "true"], 120)
        if r.returncode == 0:
            return glob, cont
        errors.append(f"{' '.join(glob[4:]) or 'defaults'}: {r.stderr.strip()[-300:]}")
    pytest.skip("podman cannot run a container on this machine: " + " | ".join(errors))


def ensure_base_image() -> None:
    """Import the mmdebstrap rootfs as ``BASE_TAG`` unless podman already has it."""
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (apt-get install podman buildah mmdebstrap)")
    if _run(["podman", "image", "exists", BASE_TAG], 60).returncode == 0:
        return
    if shutil.which("mmdebstrap") is None:
        pytest.fail("mmdebstrap is not installed (apt-get install mmdebstrap): no base image")
    with tempfile.TemporaryDirectory() as tmp:
        tar = Path(tmp) / "base.tar"
        r = _run(["mmdebstrap", "--variant=minbase", "--include=" + ",".join(BASE_PACKAGES),
                  f"--customize-hook={BASE_HOOK}", BASE_SUITE, str(tar)], BUILD_TIMEOUT)
        assert r.returncode == 0, r.stderr[-3000:]
        r = _run(["podman", "import", str(tar), BASE_TAG], 300)
        assert r.returncode == 0, r.stderr[-3000:]


def host_pip_sources() -> tuple[dict[str, str], list[str]]:
    """(PIP_* build args, podman ``-v`` mounts): this machine's pip configuration (``pip
    config list``) with every local path it names mounted read-only at the same place."""
    r = _run([sys.executable, "-m", "pip", "config", "list"], 60)
    wanted = {"index-url", "extra-index-url", "find-links", "cert", "constraint"}
    settings: dict[str, str] = {}
    for line in r.stdout.splitlines():
        key, _, value = line.partition("=")
        name = key.rsplit(".", 1)[-1]
        if name in wanted:
            settings[name] = value.strip().strip("'\"")  # the last file read wins, as in pip
    for name in ("cert", "constraint"):  # environment variables beat config files
        env = os.environ.get("PIP_" + name.upper())
        if env:
            settings[name] = env
    build_args, mounts = {}, set()
    for name, value in settings.items():
        build_args["PIP_" + name.upper().replace("-", "_")] = value
        for item in value.split():
            path = Path(item.removeprefix("file://"))
            if path.is_absolute() and path.exists():
                # a local index's pages link to files beside it (../../files/x.whl)
                mounts.add(str(path.parent if name.endswith("index-url") else path))
    return build_args, [f"-v={m}:{m}:ro" for m in sorted(mounts)]


def build_log(glob: list[str], cont: list[str], context: Path, tag: str = IMAGE_TAG) -> str:
    """``podman build`` of the repository's Dockerfile on the test base; its output."""
    import torch

    build_args, mounts = host_pip_sources()
    build_args |= {"BASE_IMAGE": BASE_TAG, "TORCH_VERSION": torch.__version__}
    cmd = glob + ["build", "--force-rm", "--network", "host", *cont, *mounts, "-t", tag, "-f",
                  str(ROOT / "Dockerfile")]
    for name, value in build_args.items():
        cmd += ["--build-arg", f"{name}={value}"]
    r = _run(cmd + [str(context)], BUILD_TIMEOUT)
    assert r.returncode == 0, (r.stdout + r.stderr)[-5000:]
    return r.stdout


@pytest.fixture(scope="module")
def image() -> tuple[list[str], list[str]]:
    ensure_base_image()
    glob, cont = podman_flags()
    before = _run(["podman", "image", "inspect", "--format", "{{.Id}}", IMAGE_TAG], 60).stdout
    started = time.monotonic()
    build_log(glob, cont, ROOT)
    seconds = time.monotonic() - started
    after = _run(["podman", "image", "inspect", "--format", "{{.Id}}", IMAGE_TAG], 60).stdout
    if before.strip() and before != after:  # the previous build, now untagged: its disk back
        _run(["podman", "rmi", before.strip()], 120)
    size = int(_run(["podman", "image", "inspect", "--format", "{{.Size}}", IMAGE_TAG],
                    60).stdout)
    print(f"\nimage {IMAGE_TAG}: {size / 2**30:.2f} GiB (CPU torch), built in {seconds:.0f} s")
    return glob, cont


def demo_model(tmp_path: Path) -> Path:
    """A world-readable copy of this machine's demo checkpoint (the image's user is uid 1000;
    the cached weights may be readable by their owner only)."""
    from edge_llm.model.demo import ensure_demo_model

    source = ensure_demo_model(progress=False)
    copy = shutil.copytree(source, tmp_path / source.name)
    for path in [copy, *copy.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return copy


def test_image_serves_the_demo_model_and_stops_on_sigterm(image, tmp_path):
    glob, cont = image
    model = demo_model(tmp_path)
    port = free_port()
    name = f"edge-llm-test-{os.getpid()}"
    r = _run(glob + ["run", "-d", "--name", name, *cont, "-p", f"127.0.0.1:{port}:8000",
                     "-v", f"{model}:/cache/models/{model.name}:ro",
                     "-e", "EDGE_LLM_MAX_MODEL_LEN=256", IMAGE_TAG], 120)
    assert r.returncode == 0, r.stderr
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + RUN_TIMEOUT
        while True:
            state = _run(["podman", "inspect", "--format", "{{.State.Status}}", name], 60)
            assert state.stdout.strip() == "running", _run(["podman", "logs", name], 60).stderr
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, _run(["podman", "logs", name], 60).stderr
            time.sleep(1)
        from openai import OpenAI

        client = OpenAI(base_url=url + "/v1", api_key="none")
        reply = client.chat.completions.create(
            model=client.models.list().data[0].id, max_tokens=8,
            messages=[{"role": "user", "content": "Name a colour."}])
        assert reply.choices[0].message.content and reply.usage.completion_tokens > 0
        user = _run(["podman", "exec", name, "id", "-un"], 60).stdout.strip()
        assert user == "edge"
        r = _run(["podman", "stop", "--time", "60", name], 120)  # SIGTERM, then 60 s grace
        assert r.returncode == 0, r.stderr
        code = _run(["podman", "inspect", "--format", "{{.State.ExitCode}}", name], 60)
        assert code.stdout.strip() == "0", _run(["podman", "logs", name], 60).stderr[-3000:]
    finally:
        _run(["podman", "rm", "-f", name], 120)


def test_a_code_change_rebuilds_only_the_source_layers(image, tmp_path):
    """With a source file changed, torch, the dependencies and the baked model come from the
    build cache: nothing is downloaded again."""
    glob, cont = image
    context = tmp_path / "context"
    shutil.copytree(ROOT, context, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", "tests", "benchmarks", "notes", "recipes", "__pycache__", "*.egg-info"))
    init = context / "edge_llm" / "__init__.py"
    init.write_text(init.read_text() + f"\n# rebuilt {time.time()}\n")
    log = build_log(glob, cont, context, tag="localhost/edge-llm:test-rebuild")
    steps = log.split("\nSTEP ")[1:]
    cached = {s.split("\n", 1)[0]: "Using cache" in s for s in steps}
    for key in ('pip install "torch==', "requirements.txt", "snapshot_download"):
        (step,) = [s for s in cached if key in s]
        assert cached[step], f"rebuilt after a source change: {step}"
    (copy,) = [s for s in cached if s.split(": ", 1)[1].startswith("COPY edge_llm")]
    assert not cached[copy]
    _run(["podman", "rmi", "localhost/edge-llm:test-rebuild"], 120)


def test_warm_cache_image_bakes_the_caches_where_the_server_looks(image, tmp_path):
    """``recipes/warm-cache/Dockerfile`` on top of the image: the server's cache directory is
    the baked one, its files are there, and the image's user can add kernels to it."""
    glob, cont = image
    context = tmp_path / "warm-cache"
    for sub in ("triton", "inductor", "probes"):
        (context / sub).mkdir(parents=True)
        (context / sub / f"{sub}.marker").write_text(sub)
    tag = "localhost/edge-llm:test-warm"
    dockerfile = ROOT / "recipes" / "warm-cache" / "Dockerfile"
    r = _run(glob + ["build", "--force-rm", *cont, "-t", tag, "--build-arg",
                     f"IMAGE={IMAGE_TAG}", "-f", str(dockerfile), str(context)], 600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    probe = ("from edge_llm import envs; "
             "from edge_llm.server.hooks import set_compile_cache_env; "
             "import os; env = set_compile_cache_env(); root = envs.CACHE_DIR.get(); "
             "print(root, sorted(os.listdir(root)), env['TRITON_CACHE_DIR']); "
             "open(os.path.join(env['TRITON_CACHE_DIR'], 'new'), 'w').write('x')")
    try:
        r = _run(glob + ["run", "--rm", "--network", "none", *cont, "--entrypoint", "python",
                         tag, "-c", probe], 120)
        assert r.returncode == 0, r.stderr[-3000:]
        assert r.stdout.split() == ["/opt/edge-llm-cache", "['inductor',", "'probes',",
                                    "'triton']", "/opt/edge-llm-cache/triton"], r.stdout
    finally:
        _run(["podman", "rmi", "-f", tag], 120)
