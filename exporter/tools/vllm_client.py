"""The few vLLM server endpoints `diagnose` and `whatif` need: /tokenize, /detokenize,
/metrics. Each answer within one deadline and a size cap; every message names the server
by its URL without the password."""
from __future__ import annotations

import json
from urllib.parse import urlsplit

from ..parse.vllm_metrics import parse
from ..peers.http import Endpoint, PeerError, exchange
from ..peers.urls import redact_url

MAX_ANSWER = 64 * 1024 * 1024


class VLLMError(Exception):
    pass


class VLLMClient:
    def __init__(self, base_url: str, timeout: float = 10.0, max_answer: int = MAX_ANSWER):
        base = base_url.rstrip("/")
        for suffix in ("/metrics", "/v1"):
            base = base.removesuffix(suffix)
        self.base = base
        self.shown = redact_url(base)  # what messages say: never a password
        self.timeout = timeout
        self.max_answer = max_answer
        self.endpoint = Endpoint(base)
        self.base_path = urlsplit(base).path

    def _exchange(self, method: str, path: str, body: bytes | None = None):
        headers = {"Content-Type": "application/json"} if body is not None else {}
        try:
            return exchange(self.endpoint, method, path=self.base_path + path, body=body, headers=headers,
                            timeout=self.timeout, size_limit=self.max_answer, error_body_limit=200)
        except PeerError as exc:
            raise VLLMError(f"{self.shown}{path}: {type(exc).__name__}: {exc}") from None

    def _post(self, path: str, body: dict) -> dict:
        answer = self._exchange("POST", path, json.dumps(body).encode())
        if answer.status != 200:
            raise VLLMError(f"{self.shown}{path}: HTTP {answer.status}: {answer.body.decode('utf-8', 'replace').strip()}")
        try:
            payload = json.loads(answer.body)
        except (ValueError, RecursionError):
            raise VLLMError(f"{self.shown}{path}: the answer is not JSON") from None
        if not isinstance(payload, dict):
            raise VLLMError(f"{self.shown}{path}: the answer is not a JSON object")
        return payload

    def tokenize_chat(self, request: dict) -> list[int]:
        """The prompt's token ids as the server's chat template renders it, with the
        generation prompt, exactly what its prefix cache hashes."""
        body = {"messages": request["messages"], "add_generation_prompt": True}
        for key in ("model", "tools"):
            if request.get(key) is not None:
                body[key] = request[key]
        tokens = self._post("/tokenize", body).get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise VLLMError(f"{self.shown}/tokenize: no token list in the answer")
        return tokens

    def tokenize_text(self, prompt: str, model: str | None = None) -> list[int]:
        body: dict = {"prompt": prompt}
        if model:
            body["model"] = model
        tokens = self._post("/tokenize", body).get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise VLLMError(f"{self.shown}/tokenize: no token list in the answer")
        return tokens

    def detokenize(self, tokens: list[int], model: str | None) -> str:
        body: dict = {"tokens": tokens}
        if model:
            body["model"] = model
        prompt = self._post("/detokenize", body).get("prompt")
        if not isinstance(prompt, str):
            raise VLLMError(f"{self.shown}/detokenize: no prompt in the answer")
        return prompt

    def block_size(self) -> int | None:
        """From vllm:cache_config_info on /metrics; None when the server does not say."""
        try:
            answer = self._exchange("GET", "/metrics")
        except VLLMError:
            return None
        return parse(answer.body.decode("utf-8", "replace")).block_size if answer.status == 200 else None
