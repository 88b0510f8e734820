"""vllm-prefix-cache-exporter: tells you, within seconds, that vLLM's prefix cache stopped working."""

__version__ = "0.1.0"
