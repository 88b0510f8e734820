"""The `diagnose` command: the first token where two chat requests part and the cache blocks that survive it,
exactly through a vLLM server's /tokenize or approximately offline."""
from __future__ import annotations

import json
import sys

from ..exitcodes import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from ..peers import files, jsonlines
from ..series.hitratio import tokens_per_block
from . import divergence
from .vllm_client import VLLMClient, VLLMError


def read_request(path: str) -> dict:
    try:
        data = jsonlines.loads(files.read_text(path, jsonlines.MAX_FILE_BYTES))
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    except jsonlines.JSONInputError as exc:
        raise ValueError(f"{path}: not JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list) or not data["messages"]:
        raise ValueError(f"{path}: not an OpenAI chat-completions request (needs a non-empty `messages` list)")
    if not isinstance(data.get("tools") or [], list):
        raise ValueError(f"{path}: `tools` must be a list")
    if problem := divergence.content_problem(data):
        raise ValueError(f"{path}: {problem}")
    return data


def diagnose_requests(a: dict, b: dict, target: str | None, block_size: int | None, offline: bool) -> divergence.Finding:
    """Raises VLLMError when the target cannot answer."""
    if offline:
        return divergence.offline(a, b, tokens_per_block(block_size))
    client = VLLMClient(target)
    tokens_a, tokens_b = client.tokenize_chat(a), client.tokenize_chat(b)
    size = tokens_per_block(block_size or client.block_size())
    d = divergence.first_divergence(tokens_a, tokens_b)
    model = a.get("model")
    window = slice(max(0, d - 12), d + 12)
    context_a = client.detokenize(tokens_a[window], model)
    context_b = client.detokenize(tokens_b[window], model)
    return divergence.online(tokens_a, tokens_b, size, context_a, context_b, a, b)


def command(args) -> int:
    """`diagnose A.json B.json`: where two chat requests part, and the cache blocks that survive."""
    if not args.offline and not args.target:
        print("error: give --target URL of the vLLM server, or --offline for an approximation", file=sys.stderr)
        return EXIT_USAGE
    try:
        a, b = read_request(args.a), read_request(args.b)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        finding = diagnose_requests(a, b, args.target, args.block_size, args.offline)
    except VLLMError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    print(json.dumps(finding.to_json()) if args.json else divergence.report(finding))
    return EXIT_OK
