"""The YAML config: the strict reader (every bad key listed with its path), the sections as
frozen dataclasses, and default_rules.yml, the one home of the rules' defaults. It imports
exporter.alerting (the rules registry it validates against) and the layers under it.
"""
