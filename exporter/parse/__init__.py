"""Every engine's and router's exposition text -> a Snapshot: the one table of upstream
metric names (vLLM, SGLang, LMCache, TensorRT-LLM, routers) and their units. Pure; it
imports nothing else of the package.
"""
