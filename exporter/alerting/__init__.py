"""The alert rules, each declared once in a registry, an alert's state machine, probable
causes, deploy and change-point detection, rollouts and the rollout analysis. Pure; it
imports exporter.series and exporter.parse.
"""
