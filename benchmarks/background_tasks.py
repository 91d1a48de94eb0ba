"""Does a user's chat wait behind Open WebUI's background tasks?

    python benchmarks/background_tasks.py                       # the demo, 4 background tasks
    python benchmarks/background_tasks.py --background 8 --serve-arg=--default-max-tokens=256

Starts ``edge-llm serve`` on a free port, then streams the user's chat message as Open WebUI
sends it (``tests/fixtures/open_webui/chat_first_message.json``: its 36 built-in tools, no
``max_tokens``; here with ``ignore_eos`` and ``max_tokens`` set so that every run produces the
same number of tokens) ``--runs`` times alone, then ``--runs`` times while ``--background``
tags and follow-up tasks (the recorded bodies, without ``max_tokens``: the server's default
bounds them) are generating. Prints the user's time to first token, time per output token and
total time in both cases, and the background tasks' lengths and durations.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from edge_llm import envs

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "open_webui"


def body(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())["body"]


def start_server(extra: list[str], timeout: float) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "edge_llm.cli", "serve", "--port", str(port),
                             "--no-log-requests", *extra], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"edge-llm serve exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("edge-llm serve did not get ready")


def user_chat(url: str, tokens: int) -> dict:
    """One streamed user message: seconds to the first token, per later token, in all."""
    req = body("chat_first_message") | {"max_tokens": tokens, "ignore_eos": True}
    began = time.monotonic()
    stamps: list[float] = []
    with httpx.stream("POST", url + "/v1/chat/completions", json=req, timeout=3600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                choices = json.loads(line[6:])["choices"]
                if choices and choices[0]["delta"].get("content"):
                    stamps.append(time.monotonic() - began)
    ttft, total = stamps[0], time.monotonic() - began
    return {"ttft_s": ttft, "tpot_s": (stamps[-1] - ttft) / max(len(stamps) - 1, 1),
            "total_s": total, "chunks": len(stamps)}


def background(url: str, name: str, out: list[dict]) -> None:
    began = time.monotonic()
    r = httpx.post(url + "/v1/chat/completions", json=body(name), timeout=3600)
    r.raise_for_status()
    out.append({"task": name, "tokens": r.json()["usage"]["completion_tokens"],
                "seconds": time.monotonic() - began})


def median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--background", type=int, default=4, help="background tasks at once")
    ap.add_argument("--runs", type=int, default=3, help="user messages per case")
    ap.add_argument("--tokens", type=int, default=32, help="tokens of each user reply")
    ap.add_argument("--serve-arg", action="append", default=[], help="extra serve flag")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds to get ready")
    ap.add_argument("--out", default=envs.OUT.get(), help="folder for the JSON")
    args = ap.parse_args()
    proc, url = start_server(args.serve_arg, args.timeout)
    try:
        user_chat(url, 4)  # first-request costs out of the figures
        alone = [user_chat(url, args.tokens) for _ in range(args.runs)]
        tasks: list[dict] = []
        threads = [threading.Thread(target=background, args=(url, name, tasks))
                   for name in (["tags", "follow_up"] * args.background)[:args.background]]
        for t in threads:
            t.start()
        time.sleep(5)  # the tasks are past their prefill and decoding
        loaded = [user_chat(url, args.tokens) for _ in range(args.runs)]
        running_after = sum(t.is_alive() for t in threads)
        for t in threads:
            t.join()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    result = {"alone": alone, "with_background": loaded, "background": tasks,
              "background_still_running_after_user_runs": running_after,
              "tokens": args.tokens, "serve_args": args.serve_arg}
    print(f"| user message ({args.tokens} tokens), medians of {args.runs} | alone | with "
          f"{args.background} background tasks |\n| --- | --- | --- |")
    for key in ("ttft_s", "tpot_s", "total_s"):
        print(f"| {key} | {median(alone, key):.2f} | {median(loaded, key):.2f} |")
    print(f"background tasks: {[(t['task'], t['tokens'], round(t['seconds'])) for t in tasks]}"
          f"; {running_after} still running when the user runs ended")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "background_tasks.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
