"""The few vLLM server endpoints `diagnose` needs: /tokenize, /detokenize, /metrics."""
from __future__ import annotations

import requests

from .vllm_metrics import parse


class VLLMError(Exception):
    pass


class VLLMClient:
    def __init__(self, base_url: str, timeout: float = 10.0):
        base = base_url.rstrip("/")
        for suffix in ("/metrics", "/v1"):
            base = base.removesuffix(suffix)
        self.base = base
        self.timeout = timeout
        self.session = requests.Session()

    def _post(self, path: str, body: dict) -> dict:
        try:
            resp = self.session.post(self.base + path, json=body, timeout=self.timeout)
        except requests.RequestException as exc:
            raise VLLMError(f"{self.base}{path}: {type(exc).__name__}") from None
        if resp.status_code != 200:
            raise VLLMError(f"{self.base}{path}: HTTP {resp.status_code}: {resp.text[:200].strip()}")
        try:
            return resp.json()
        except ValueError:
            raise VLLMError(f"{self.base}{path}: the answer is not JSON") from None

    def tokenize_chat(self, request: dict) -> list[int]:
        """The prompt's token ids as the server's chat template renders it, with the
        generation prompt, exactly what its prefix cache hashes."""
        body = {"messages": request["messages"], "add_generation_prompt": True}
        for key in ("model", "tools"):
            if request.get(key) is not None:
                body[key] = request[key]
        tokens = self._post("/tokenize", body).get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise VLLMError(f"{self.base}/tokenize: no token list in the answer")
        return tokens

    def tokenize_text(self, prompt: str, model: str | None = None) -> list[int]:
        body: dict = {"prompt": prompt}
        if model:
            body["model"] = model
        tokens = self._post("/tokenize", body).get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise VLLMError(f"{self.base}/tokenize: no token list in the answer")
        return tokens

    def detokenize(self, tokens: list[int], model: str | None) -> str:
        body: dict = {"tokens": tokens}
        if model:
            body["model"] = model
        prompt = self._post("/detokenize", body).get("prompt")
        if not isinstance(prompt, str):
            raise VLLMError(f"{self.base}/detokenize: no prompt in the answer")
        return prompt

    def block_size(self) -> int | None:
        """From vllm:cache_config_info on /metrics; None when the server does not say."""
        try:
            resp = self.session.get(self.base + "/metrics", timeout=self.timeout)
        except requests.RequestException:
            return None
        return parse(resp.text).block_size if resp.status_code == 200 else None
