"""A target's history of polls and the window math over it: reset-adjusted samples,
increases and quantiles as PromQL computes them, the one ratio policy and its units
(tokens, blocks, tiers). Pure; it imports only exporter.parse.
"""
