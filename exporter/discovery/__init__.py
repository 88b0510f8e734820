"""Where targets and their data come from besides the static list: a Prometheus's targets
API, file_sd files, shards, and a Prometheus asked for a fleet's baseline. It imports
exporter.config and the layers under it.
"""
