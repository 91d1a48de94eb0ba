"""A user's first hour against a real ``edge-llm serve`` on the demo model: vLLM's tokenizer
routes (as lm-eval's remote tokenizer calls them), request defaults, ``/metrics`` by route,
status and finish reason, the 499 of a client that leaves mid-stream, and the start-up log.

Most tests share the session's ``live_server``; one short-lived server of this module runs with
``--generation-config DIR --default-max-tokens 5`` (no warm-up, to start fast)."""

from __future__ import annotations

import json
import os
import socket
import time
import uuid

import httpx
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import LiveServer, serve_process

MODEL = "SmolLM2-135M-Instruct-AWQ"
CHAT = [{"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "What colour is the sky?"}]


def samples(url: str) -> dict[tuple[str, tuple], float]:
    """/metrics as {(sample name, sorted labels): value}."""
    text = httpx.get(url + "/metrics", timeout=30).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def count(metrics: dict, name: str, **labels: str) -> float:
    """The sum of ``name`` over series carrying ``labels``."""
    return sum(v for (n, lab), v in metrics.items()
               if n == name and set(labels.items()) <= set(lab))


# ---- tokenizer routes ---------------------------------------------------------------------


def test_tokenize_counts_what_generation_sees(live_server):
    url = live_server.url
    prompt = f"Edge devices run small models {uuid.uuid4().hex[:6]}"
    tok = httpx.post(url + "/tokenize", json={"model": MODEL, "prompt": prompt}).json()
    assert set(tok) == {"count", "max_model_len", "tokens", "token_strs"}
    assert tok["count"] == len(tok["tokens"]) > 3 and tok["max_model_len"] == 1024
    assert tok["token_strs"] is None
    done = httpx.post(url + "/v1/completions", timeout=120, json={
        "prompt": prompt, "max_tokens": 1, "temperature": 0}).json()
    assert done["usage"]["prompt_tokens"] == tok["count"]
    chat_tok = httpx.post(url + "/tokenize", json={"messages": CHAT}).json()
    reply = httpx.post(url + "/v1/chat/completions", timeout=120, json={
        "messages": CHAT, "max_tokens": 1, "temperature": 0}).json()
    assert reply["usage"]["prompt_tokens"] == chat_tok["count"]
    # token strings, and the text back from the ids
    strs = httpx.post(url + "/tokenize", json={"prompt": prompt, "add_special_tokens": False,
                                               "return_token_strs": True}).json()
    assert len(strs["token_strs"]) == strs["count"]
    assert all(isinstance(s, str) and s for s in strs["token_strs"])
    back = httpx.post(url + "/detokenize", json={"tokens": strs["tokens"], "model": MODEL})
    assert back.status_code == 200 and back.json() == {"prompt": prompt}


def test_lm_eval_remote_tokenizer_flow(live_server):
    """What lm-eval's ``RemoteTokenizer`` does: /tokenizer_info first (it needs eos_token),
    encode the EOS text without special tokens, render the served chat template itself."""
    url = live_server.url
    info = httpx.get(url + "/tokenizer_info")
    assert info.status_code == 200, info.text
    info = info.json()
    assert info["eos_token"] == "<|im_end|>" and isinstance(info["bos_token"], str)
    assert info["model_max_length"] == 1024 and info["tokenizer_class"]
    eos = httpx.post(url + "/tokenize", json={"prompt": info["eos_token"],
                                              "add_special_tokens": False}).json()
    assert eos["tokens"] == [2]  # the demo's <|im_end|>
    template = ImmutableSandboxedEnvironment().from_string(info["chat_template"])
    rendered = template.render(messages=CHAT, add_generation_prompt=True)
    by_client = httpx.post(url + "/tokenize", json={"prompt": rendered,
                                                    "add_special_tokens": False}).json()
    by_server = httpx.post(url + "/tokenize", json={"messages": CHAT}).json()
    assert by_client["tokens"] == by_server["tokens"]
    # continuing the final message instead of opening a new one
    prefill = [*CHAT, {"role": "assistant", "content": "Bl"}]
    cont = httpx.post(url + "/tokenize", json={"messages": prefill,
                                               "add_generation_prompt": False,
                                               "continue_final_message": True}).json()
    text = httpx.post(url + "/detokenize", json={"tokens": cont["tokens"]}).json()["prompt"]
    assert text.endswith("<|im_start|>assistant\nBl")


@pytest.mark.parametrize(("path", "body", "status", "param"), [
    ("/tokenize", {"prompt": "a", "messages": CHAT}, 400, "prompt"),
    ("/tokenize", {"model": MODEL}, 400, "messages"),
    ("/tokenize", {"prompt": "a", "model": "no-such-model"}, 404, "model"),
    ("/tokenize", {"messages": CHAT, "add_generation_prompt": True,
                   "continue_final_message": True}, 400, "continue_final_message"),
    ("/tokenize", {"messages": CHAT, "chat_template_kwargs": {"messages": []}}, 400,
     "chat_template_kwargs"),
    ("/tokenize", {"messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role"),
    ("/detokenize", {"tokens": [1, 10**6]}, 400, "tokens"),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
    ("/detokenize", {"tokens": "abc"}, 400, "tokens"),
    ("/detokenize", {}, 400, "tokens"),
])
def test_tokenizer_routes_refuse_bad_input(live_server, path, body, status, param):
    r = httpx.post(live_server.url + path, json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"], err


# ---- metrics and the request log ------------------------------------------------------------


def test_metrics_count_routes_statuses_and_finish_reasons(live_server):
    url = live_server.url
    before = samples(url)
    assert httpx.get(url + "/no/such/route").status_code == 404
    assert httpx.post(url + "/v1/chat/completions", json={"messages": []}).status_code == 400
    ok = httpx.post(url + "/v1/chat/completions", timeout=120, json={
        "messages": CHAT, "max_tokens": 2, "temperature": 0, "ignore_eos": True})
    assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] == "length"
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=120, json={
            "messages": CHAT, "max_tokens": 2, "temperature": 0, "ignore_eos": True,
            "stream": True}) as r:
        assert r.status_code == 200 and r.read().endswith(b"data: [DONE]\n\n")
    assert httpx.get(url + f"/v1/models/{MODEL}").status_code == 200
    after = samples(url)

    def delta(name: str, **labels: str) -> float:
        return count(after, name, **labels) - count(before, name, **labels)

    assert delta("http_requests_total", handler="none", method="GET", status="404") == 1
    chat = "/v1/chat/completions"
    assert delta("http_requests_total", handler=chat, method="POST", status="400") == 1
    assert delta("http_requests_total", handler=chat, method="POST", status="200") == 2
    assert delta("http_requests_total", status="499") == 0  # a stream read to its end
    # a path parameter is counted under its template, not the raw path
    assert delta("http_requests_total", handler="/v1/models/{model_id}",
                 status="200") == 1
    assert delta("vllm:request_success_total", finished_reason="length") == 2
    assert delta("vllm:request_success_total", finished_reason="stop") == 0


def test_client_leaving_a_stream_is_a_499_with_its_tokens(live_server):
    url = live_server.url
    before = samples(url)
    request_id = f"leave-{uuid.uuid4().hex[:10]}"
    body = {"messages": CHAT, "max_tokens": 400, "temperature": 0, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120,
                      headers={"x-request-id": request_id}) as r:
        assert r.status_code == 200
        events = 0
        for line in r.iter_lines():
            events += line.startswith("data: ")
            if events == 6:
                break  # leave: closing the response drops the connection
    deadline = time.monotonic() + 30
    line = ""
    while time.monotonic() < deadline:
        after = samples(url)
        lines = [ln for ln in (live_server.log.read_text(errors="replace").splitlines()
                               if live_server.log else []) if f"id={request_id}" in ln]
        done = count(after, "http_requests_total", status="499") > count(
            before, "http_requests_total", status="499")
        if done and (lines or live_server.log is None):
            line = lines[0] if lines else ""
            break
        time.sleep(0.2)
    else:
        pytest.fail("the aborted stream was not counted as a 499")
    assert count(after, "http_requests_total", handler="/v1/chat/completions",
                 status="499") - count(before, "http_requests_total",
                                       handler="/v1/chat/completions", status="499") == 1
    assert count(after, "vllm:request_success_total", finished_reason="abort") - count(
        before, "vllm:request_success_total", finished_reason="abort") == 1
    if live_server.log is not None:
        assert " 499 " in line and "POST /v1/chat/completions" in line, line
        produced = int(line.split("completion_tokens=")[1].split()[0])
        assert 5 <= produced < 400, line  # what it produced before the client left


def log_line(server: LiveServer, request_id: str, deadline: float) -> str:
    """The request's log line, once written (the server writes it when the request ends)."""
    while time.monotonic() < deadline:
        for line in server.log.read_text(errors="replace").splitlines():
            if f"id={request_id}" in line:
                return line
        time.sleep(0.2)
    pytest.fail(f"no log line for {request_id}")


def test_client_leaving_before_the_reply_is_a_499_with_its_tokens(live_server):
    """A non-streaming request whose client hangs up once tokens are being generated."""
    if live_server.log is None:
        pytest.skip("a server started outside the tests: its log is not readable here")
    url = live_server.url
    host, port = url.removeprefix("http://").split(":")
    request_id = f"hangup-{uuid.uuid4().hex[:10]}"
    body = json.dumps({"messages": CHAT, "max_tokens": 400, "temperature": 0,
                       "ignore_eos": True}).encode()
    before = samples(url)
    tokens = "vllm:generation_tokens_total"
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: " + host.encode()
                     + b"\r\nContent-Type: application/json\r\nX-Request-Id: "
                     + request_id.encode() + b"\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\n\r\n" + body)
        deadline = time.monotonic() + 120
        while count(samples(url), tokens) - count(before, tokens) < 3:
            assert time.monotonic() < deadline, "no tokens generated"
            time.sleep(0.1)
    line = log_line(live_server, request_id, time.monotonic() + 30)
    assert " 499 " in line and "POST /v1/chat/completions" in line, line
    produced = int(line.split("completion_tokens=")[1].split()[0])
    assert 3 <= produced < 400, line
    assert int(line.split("prompt_tokens=")[1].split()[0]) > 10, line


# ---- defaults and the start-up log of a server with flags -----------------------------------


@pytest.fixture(scope="module")
def flagged_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("flagged")
    (tmp / "generation_config.json").write_text(json.dumps(
        {"temperature": 0.0, "top_k": 5, "max_new_tokens": 7}))
    with serve_process(["--max-model-len", "512", "--max-num-seqs", "4", "--no-warmup",
                        "--generation-config", str(tmp), "--default-max-tokens", "5"],
                       tmp / "serve.log") as server:
        yield server


def test_defaults_from_flags_and_the_generation_config(flagged_server):
    url = flagged_server.url

    def chat(**extra) -> dict:
        r = httpx.post(url + "/v1/chat/completions", timeout=120,
                       json={"messages": CHAT, "ignore_eos": True, **extra})
        assert r.status_code == 200, r.text
        return r.json()

    # the first request fills the prefix cache: on the CPU its prompt step runs on the dense
    # bf16 weights (16+ rows), a later hit's short tail on the int4 kernel, whose rounding
    # can move a near-tie; every compared request below is a prefix hit
    chat(seed=0)
    # no max_tokens: the operator's --default-max-tokens 5 (over the file's max_new_tokens 7)
    first = chat(seed=1)
    assert first["usage"]["completion_tokens"] == 5
    assert first["choices"][0]["finish_reason"] == "length"
    # the file's temperature 0 makes any seed greedy (a top_k of 1 would not: bf16 logits tie,
    # and top_k keeps ties, as vLLM's does); the request's own fields win over the file's
    texts = {chat(seed=s)["choices"][0]["message"]["content"] for s in (2, 3)}
    assert texts == {first["choices"][0]["message"]["content"]}
    sampled = {chat(seed=s, top_k=-1, temperature=1.5, max_tokens=6)["choices"][0]["message"]
               ["content"] for s in (11, 12, 13)}
    assert len(sampled) > 1, sampled
    assert chat(max_tokens=3)["usage"]["completion_tokens"] == 3


def test_start_up_log_says_not_ready_then_ready(flagged_server):
    text = flagged_server.log.read_text(errors="replace")
    lines = text.splitlines()

    def index(fragment: str) -> int:
        found = [i for i, ln in enumerate(lines) if fragment in ln]
        assert found, f"{fragment!r} not in the log:\n{text[-3000:]}"
        return found[0]

    assert index("Application startup complete") < index("NOT READY yet") < index("READY: ")
    assert index("startup phase weight_load") < index("READY: ")
    assert "at most 5 tokens (--default-max-tokens)" in text
    assert "top_k=5" in text and "temperature=0.0" in text
    if not os.path.exists("/dev/nvidia0"):  # no CUDA phase named on a CPU machine
        assert "CUDA context" not in text
        assert "startup phase kv_allocation" in text and "(tokenizer and KV cache)" in text


def test_live_server_applies_the_demo_models_recommended_sampling(live_server):
    if live_server.log is None:
        pytest.skip("a server started outside the tests: its log is not readable here")
    text = live_server.log.read_text(errors="replace")
    assert "temperature=0.2, top_p=0.9" in text  # the demo's generation_config.json
    assert "Chat requests without max_tokens generate at most 1024 tokens" in text
