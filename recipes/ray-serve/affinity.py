"""Conversation affinity for Ray Serve: a conversation's turns go to the replica holding its prefix.

Ray Serve's request router (the ``request_router_class`` extension point) sees a request before
it reaches a replica, but a request from Ray's HTTP proxy carries only its headers there, not its
body. So the affinity app has two tiers: ``AffinityIngress`` (a light HTTP deployment) reads the
body and calls the engine replicas' ``forward`` through a deployment handle, which routes with
``ConversationAffinityRouter``: it hashes the conversation's leading part (the first two chat
messages, or the prompt's first characters) and ranks replicas by rendezvous hashing, so that
every turn of a conversation prefers one replica and a replica joining or leaving moves only its
own share of conversations. A preferred replica at ``max_ongoing_requests`` is skipped for the
next in rank, as Ray does for any full replica.

Written here rather than using Ray's ``PrefixCacheAffinityRouter``: that one is importable only
with vLLM installed (``ray.serve.llm``) and keeps a prefix tree in an extra actor; a stateless hash
of the shared leading part gives the same replica for every turn of a conversation.
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica

LEADING_MESSAGES = 2  # system prompt + first user turn: shared by every later turn
LEADING_CHARS = 512  # of a completions prompt


def conversation_key(body: bytes) -> str | None:
    """The part of a request every later turn of its conversation starts with; None if the body
    is not an OpenAI chat or completions request (then any replica will do)."""
    try:
        req = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(req, dict):
        return None
    messages = req.get("messages")
    if isinstance(messages, list) and messages:
        return json.dumps(messages[:LEADING_MESSAGES], sort_keys=True)
    prompt = req.get("prompt")
    if isinstance(prompt, str) and prompt:
        return prompt[:LEADING_CHARS]
    return None


def rank(key: str, replica_ids: list[str]) -> list[str]:
    """Rendezvous (highest random weight) order of ``replica_ids`` for ``key``."""
    def weight(rid: str) -> bytes:
        return hashlib.blake2b(f"{rid}\0{key}".encode(), digest_size=8).digest()

    return sorted(replica_ids, key=weight, reverse=True)


class ConversationAffinityRouter(FIFOMixin, RequestRouter):
    """Ranks replicas by the request's conversation key; no key: two random replicas."""

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None,
                              ) -> list[list[RunningReplica]]:
        key = None
        if pending_request is not None:
            body = next((a for a in pending_request.args if isinstance(a, bytes)), None)
            key = None if body is None else conversation_key(body)
        if key is None:
            return [random.sample(candidate_replicas, min(2, len(candidate_replicas)))]
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        return [[by_id[rid]] for rid in rank(key, list(by_id))]


def forwarded_headers(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """Response headers to pass on from a replica (the proxy sets the framing ones itself)."""
    skip = {b"content-length", b"transfer-encoding", b"connection"}
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in headers
            if k.lower() not in skip}


def http_scope(method: str, path: str, query: str, headers: list[Any]) -> dict[str, Any]:
    """An ASGI HTTP scope for a request forwarded by ``AffinityIngress``."""
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
            "query_string": query.encode(), "root_path": "",
            "headers": [(bytes(k), bytes(v)) for k, v in headers],
            "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 80)}
