"""The KV cache events a target publishes (`targets[].kv_events`) and how they are read
(the top-level `kv_events:` section). vLLM binds its publisher when its endpoint has `*`
(`--kv-events-config '{"endpoint": "tcp://*:5557", ...}'`): give the pod's address as
`endpoint` and we connect. With any other endpoint vLLM connects: give `bind` and we
listen there. A data-parallel rank r publishes on the port plus r.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .reader import Reader, nonempty_string, positive_int

_ENDPOINT = re.compile(r"^(tcp://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.*-]+):\d{1,5}|ipc://\S+)$")


@dataclass(frozen=True)
class KVEndpoint:
    address: str  # tcp://host:port or ipc://path
    bind: bool = False  # we listen (vLLM given a plain tcp endpoint connects to us)
    topic: str = ""  # vLLM's `topic`; "" takes every topic
    replay: str | None = None  # vLLM's replay_endpoint as we reach it: a gap is asked there once


@dataclass(frozen=True)
class KVEventsConfig:
    tokenizer: str = ""  # a tokenizer.json: alerts then show the text where a prompt changes, not token ids
    index_blocks: int = 200_000  # blocks indexed per target, the oldest dropped first
    top_groups: int = 10  # prompt groups, cache_salt and LoRA values on /metrics each; the rest sum into "other"


def endpoint(value: Any) -> str:
    text = nonempty_string(value)
    if not _ENDPOINT.match(text):
        raise ValueError(f"{text!r} is not tcp://host:port or ipc://path")
    return text


def read_endpoint(r: Reader, raw: Any, path: str) -> KVEndpoint | None:
    if raw is None:
        return None
    data = r.mapping(raw, path, {"endpoint", "bind", "topic", "replay_endpoint"})
    if ("endpoint" in data) == ("bind" in data):
        r.errors.append(f"{path}: give one of endpoint (vLLM binds tcp://*:PORT, we connect) or bind (vLLM connects to us)")
        return None
    key = "endpoint" if "endpoint" in data else "bind"
    address = r.value(data, path, key, endpoint, "")
    if key == "endpoint" and "*" in address:
        r.errors.append(f"{path}.endpoint: {address!r} is vLLM's side; give the address we reach it at, e.g. tcp://10.0.0.5:5557")
    return KVEndpoint(address=address, bind=key == "bind", topic=r.value(data, path, "topic", str, ""),
                      replay=r.value(data, path, "replay_endpoint", endpoint, None))


def read_settings(r: Reader, raw: Any) -> KVEventsConfig:
    d = KVEventsConfig()
    data = r.mapping(raw, "kv_events", {"tokenizer", "index_blocks", "top_groups"})
    return KVEventsConfig(tokenizer=r.value(data, "kv_events", "tokenizer", nonempty_string, d.tokenizer),
                          index_blocks=r.value(data, "kv_events", "index_blocks", positive_int, d.index_blocks),
                          top_groups=r.value(data, "kv_events", "top_groups", positive_int, d.top_groups))
