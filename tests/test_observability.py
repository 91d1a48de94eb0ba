"""recipes/observability against a real Prometheus scraping the real ``edge-llm serve``.

Debian's ``prometheus`` package (``/usr/bin/prometheus`` and ``promtool``) runs on a loopback port
with a temporary storage directory and a 1 s scrape interval, scraping the session's live server
while a small bounded load runs. Every Grafana panel query and KEDA trigger query must return
data and every alert expression must evaluate (to the expected empty result on a healthy
replica) through Prometheus' HTTP API; every metric name they use must exist on the server.
``promtool`` checks the files and runs the alert unit tests (alerts_test.yml: each alert fires
on the series that trip it).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import LiveServer, free_port

RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "observability"
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None or PROMTOOL is None,
    reason="the prometheus binary is absent (apt-get install -y prometheus; .ci/run does)")

# what Grafana substitutes in the dashboard's queries, for a query sent straight to Prometheus
GRAFANA_VARS = {"$__rate_interval": "1m", "$job": "edge-llm", "$model_name": ".+"}
# PromQL words that look like metric names in an expression but are not
PROMQL_WORDS = {"sum", "by", "rate", "increase", "histogram_quantile", "max", "min", "count",
                "or", "and", "vector", "min_over_time", "deriv", "le", "without", "on"}


def _dashboard_queries() -> list[tuple[str, str]]:
    dash = json.loads((RECIPE / "grafana-dashboard.json").read_text())
    out = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for var, value in GRAFANA_VARS.items():
                expr = expr.replace(var, value)
            assert "$" not in expr, f"unsubstituted variable in {panel['title']!r}: {expr}"
            out.append((f"{panel['title']} / {target['legendFormat']}", expr))
    return out


def _keda_queries() -> list[str]:
    scaled = yaml.safe_load((RECIPE / "keda-scaledobject.yaml").read_text())
    assert scaled["kind"] == "ScaledObject" and scaled["spec"]["minReplicaCount"] >= 1
    triggers = scaled["spec"]["triggers"]
    assert all(t["type"] == "prometheus" and float(t["metadata"]["threshold"]) > 0
               for t in triggers)
    return [t["metadata"]["query"] for t in triggers]


def _alert_rules() -> list[dict]:
    groups = yaml.safe_load((RECIPE / "alerts.yml").read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def _metric_names(expr: str) -> set[str]:
    """Metric names an expression selects (label matchers, groupings and strings stripped)."""
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"|\b(by|without|on|ignoring)\s*\([^)]*\)",
                  " ", expr)
    words = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", bare)) - PROMQL_WORDS
    return {w for w in words if not re.fullmatch(r"[0-9.e]+", w)}


def test_promtool_checks_config_and_rules_and_runs_alert_unit_tests():
    for args in (["check", "config", "prometheus.yml"], ["check", "rules", "alerts.yml"],
                 ["test", "rules", "alerts_test.yml"]):
        r = subprocess.run([PROMTOOL, *args], cwd=RECIPE, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, f"promtool {' '.join(args)}:\n{r.stdout}\n{r.stderr}"


@pytest.fixture(scope="module")
def prometheus(live_server: LiveServer, tmp_path_factory) -> Iterator[str]:
    """Prometheus on the recipe's config, its targets pointed at the live server."""
    tmp = tmp_path_factory.mktemp("prometheus")
    config = yaml.safe_load((RECIPE / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str(RECIPE / "alerts.yml")]
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "edge-llm"
    job["static_configs"] = [{"targets": [live_server.url.removeprefix("http://")]}]
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = open(tmp / "prometheus.log", "wb")
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(lambda: httpx.get(url + "/-/ready", timeout=2).status_code == 200, 30,
              "Prometheus ready", tmp / "prometheus.log")
        _wait(lambda: _query(url, 'up{job="edge-llm"} == 1'), 30, "the live server scraped",
              tmp / "prometheus.log")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


def _wait(ready, timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ready():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    pytest.fail(f"{what}: not within {timeout:.0f} s\n{log.read_text()[-3000:]}")


def _query(url: str, expr: str) -> list[dict]:
    r = httpx.get(url + "/api/v1/query", params={"query": expr}, timeout=10)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", f"{expr}: {r.text}"
    return body["data"]["result"]


def _load(base: str, n: int = 6) -> None:
    """``n`` concurrent streamed chats (short replies) and one request for an unknown model."""
    from openai import NotFoundError, OpenAI

    client = OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    errors: list[BaseException] = []

    def chat(i: int) -> None:
        try:
            stream = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": f"Count to {i + 3}."}],
                max_tokens=12, stream=True, temperature=0)
            assert sum(1 for _ in stream) > 1
        except BaseException as exc:  # re-raised in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=chat, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert not errors, errors
    with pytest.raises(NotFoundError):
        client.chat.completions.create(model="no-such-model", max_tokens=1,
                                       messages=[{"role": "user", "content": "hi"}])


@pytest.fixture(scope="module")
def loaded(prometheus: str, live_server: LiveServer) -> str:
    """Prometheus once the load's figures are in it (a few 1 s scrapes after the load)."""
    _load(live_server.url)
    time.sleep(4)
    return prometheus


def test_every_dashboard_and_keda_query_returns_data(loaded: str):
    queries = _dashboard_queries() + [("KEDA trigger", q) for q in _keda_queries()]
    assert len(queries) >= 20
    empty = [(title, expr) for title, expr in queries if not _query(loaded, expr)]
    assert not empty, "dashboard queries without data:\n" + "\n".join(map(str, empty))
    gen = _query(loaded, 'sum(increase(vllm:generation_tokens_total{job="edge-llm"}[1m]))')
    assert float(gen[0]["value"][1]) > 0  # the load shows up as tokens


def test_alert_rules_load_and_evaluate_empty_on_a_healthy_replica(loaded: str):
    rules = _alert_rules()
    assert {r["alert"] for r in rules} == {"EdgeLLMQueueGrowing", "EdgeLLMKVCacheAlmostFull",
                                           "EdgeLLMHighErrorRate", "EdgeLLMNoReadyReplica"}
    for rule in rules:
        assert _query(loaded, rule["expr"]) == [], rule["alert"]  # healthy: nothing fires
    deadline = time.monotonic() + 10
    while True:  # Prometheus itself evaluated every rule without error
        groups = httpx.get(loaded + "/api/v1/rules", timeout=10).json()["data"]["groups"]
        served = {r["name"]: r for g in groups for r in g["rules"]}
        if set(served) == {r["alert"] for r in rules} and all(
                r["health"] == "ok" for r in served.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert {name: r["health"] for name, r in served.items()} == {
        r["alert"]: "ok" for r in rules}, served


def test_every_metric_name_used_exists_on_the_server(loaded: str):
    """A misspelt name would make its panel, alert or trigger silently empty: every name the
    dashboard, the alerts and the KEDA triggers select has series scraped from the server."""
    exprs = ([e for _, e in _dashboard_queries()] + [r["expr"] for r in _alert_rules()]
             + _keda_queries())
    names = set().union(*map(_metric_names, exprs))
    assert {"vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "http_requests_total",
            "vllm:engine_sleep_state", "edge_llm:startup_phase_seconds"} <= names
    missing = sorted(n for n in names if not _query(loaded, f'{{__name__="{n}"}}'))
    assert not missing, f"not served by edge-llm: {missing}"
