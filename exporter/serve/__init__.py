"""What the sidecar serves: the published state (one store, read as one moment), our
/metrics, the HTTP APIs and status page, the HTTP(S) server and its web config (TLS,
basic auth). It imports exporter.monitor, exporter.discovery and the layers under them.
"""
