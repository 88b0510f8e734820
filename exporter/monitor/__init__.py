"""The engine that runs every poll through the windows, rules and causes, the one immutable
view of a target it publishes, and the recording format and its replay through the same
engine (`backtest`). Pure; it imports exporter.config and the layers under it.
"""
