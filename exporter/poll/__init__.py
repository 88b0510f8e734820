"""The sidecar's own traffic with its vLLM targets: the poll loop (scrape -> parse ->
engine -> publish) and the warm-up after a start. It publishes into exporter.serve's
state and imports the layers under it.
"""
