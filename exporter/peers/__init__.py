"""The peers we read from: HTTP servers (targets, Prometheus, Alertmanager, vLLM's own
endpoints) and files users hand us, each read under a total deadline and a size cap, with
URLs shown without their credentials. It imports nothing else of the package.
"""
