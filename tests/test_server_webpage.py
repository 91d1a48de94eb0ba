"""The web chat page at ``/`` in headless Chromium (Debian's /usr/bin/chromium driven by the
PyPI ``playwright`` package) against the real server: streaming replies, history, the stop
button, error display. Saves a screenshot next to the test's tmp files."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(),
                                reason="needs Debian's chromium at /usr/bin/chromium")


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright  # in the [test] extra

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def page(browser, live_server):
    page = browser.new_page(viewport={"width": 1000, "height": 700})
    page.set_default_timeout(60_000)
    page.goto(live_server.url + "/")
    yield page
    page.close()


def running(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    return float(re.search(r"^vllm:num_requests_running\{[^}]*\} (\S+)$", text, re.M)[1])


def test_page_streams_reply_keeps_history_and_shows_model(page, live_server, tmp_path):
    page.wait_for_function("document.getElementById('model-name').textContent.includes('Smol')")
    page.fill("#temperature", "0")
    page.fill("#max-tokens", "12")
    page.fill("#prompt", "What is the capital of France?")
    page.press("#prompt", "Enter")
    page.wait_for_selector(".msg.assistant:not(.streaming)")
    replies = page.locator(".msg.assistant")
    assert "Paris" in replies.nth(0).inner_text()
    assert page.locator(".msg.user").nth(0).inner_text() == "What is the capital of France?"
    page.fill("#prompt", "Say it again in one word.")
    page.click("#send")
    page.wait_for_function(
        "document.querySelectorAll('.msg.assistant').length === 2 && "
        "!document.querySelector('.msg.assistant.streaming')")
    assert page.locator(".msg.assistant").nth(1).inner_text().strip()
    history = page.evaluate("state.history")
    assert [m["role"] for m in history] == ["user", "assistant", "user", "assistant"]
    shot = tmp_path / "chat.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000


def test_stop_button_aborts_generation(page, live_server):
    page.click("#reset")
    page.fill("#temperature", "0.8")
    page.fill("#max-tokens", "800")
    page.fill("#prompt", "Write a very long story about a lighthouse keeper.")
    page.click("#send")
    page.wait_for_function(
        "(document.querySelector('.msg.assistant') || {textContent: ''}).textContent.length > 20")
    assert page.is_enabled("#stop") and not page.is_enabled("#send")
    page.click("#stop")
    page.wait_for_selector(".msg.assistant .meta")
    assert "(stopped)" in page.locator(".msg.assistant .meta").inner_text()
    assert page.is_enabled("#send")
    deadline = time.monotonic() + 10
    while running(live_server.url) != 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert running(live_server.url) == 0  # the server aborted the request


def test_errors_are_displayed(page):
    page.click("#reset")
    page.fill("#max-tokens", "5000")  # more than --max-model-len 1024
    page.fill("#prompt", "Hello")
    page.click("#send")
    page.wait_for_selector("#error", state="visible")
    assert "maximum context length is 1024" in page.inner_text("#error")
    assert page.evaluate("state.history.length") == 0
    assert page.locator(".msg").count() == 0 and page.input_value("#prompt") == "Hello"


def test_api_key_prompt_flow_over_fake_engine(browser, fake_tokenizer, token_scripts):
    """HTTP layer only: a server with --api-key; the page shows the 401, then works with the
    key typed in (kept in localStorage)."""
    from edge_llm.server.terminal_chat import ThreadedServer
    from tests.test_server_fake_engine import FakeEngine, make_app

    server = ThreadedServer(make_app(FakeEngine(fake_tokenizer, token_scripts),
                                     api_key="page-key"))
    server.start()
    try:
        page = browser.new_page()
        page.set_default_timeout(30_000)
        page.goto(server.url + "/")
        page.wait_for_selector("#error", state="visible")
        assert "API key" in page.inner_text("#error")
        page.fill("#api-key", "page-key")
        page.dispatch_event("#api-key", "change")
        page.wait_for_function(
            "document.getElementById('model-name').textContent === 'fake-model'")
        assert not page.is_visible("#error")
        page.fill("#max-tokens", "5")
        page.fill("#prompt", "hello")
        page.click("#send")
        page.wait_for_selector(".msg.assistant:not(.streaming)")
        reply = page.locator(".msg.assistant").nth(0).inner_text()
        assert reply.startswith(fake_tokenizer.decode(token_scripts[0][:5]))
        assert page.evaluate("localStorage.getItem('edge-llm-api-key')") == "page-key"
        page.close()
    finally:
        server.stop()


def test_reasoning_is_shown_folded_over_fake_engine(browser, fake_tokenizer):
    """A reasoning model's <think> text (split by --reasoning-parser) sits folded above the
    reply; the reply alone goes into the history."""
    from edge_llm.server.terminal_chat import ThreadedServer
    from tests.test_server_fake_engine import FakeEngine, make_app

    script = fake_tokenizer.encode("<think>Plan the answer.</think>The answer is 4.",
                                   add_special_tokens=False)
    server = ThreadedServer(make_app(FakeEngine(fake_tokenizer, [script]),
                                     reasoning_parser="deepseek_r1"))
    server.start()
    try:
        page = browser.new_page()
        page.set_default_timeout(30_000)
        page.goto(server.url + "/")
        page.fill("#max-tokens", str(len(script)))
        page.fill("#prompt", "2 + 2?")
        page.click("#send")
        page.wait_for_selector(".msg.assistant:not(.streaming)")
        folded = page.locator(".msg.assistant details.reasoning")
        assert folded.count() == 1 and not folded.evaluate("d => d.open")
        assert folded.locator("div").text_content() == "Plan the answer."
        assert page.evaluate("state.history[1].content") == "The answer is 4."
        page.close()
    finally:
        server.stop()
