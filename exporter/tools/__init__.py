"""Offline tools a user runs beside the sidecar (diagnose, whatif, lint) and what they share: the cache model,
block-hash traces, capacity curves and a client for a vLLM server's tokenizer. The sidecar never imports them."""
