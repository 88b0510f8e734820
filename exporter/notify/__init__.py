"""Delivery of alert states to every Alertmanager: one queue and sender per Alertmanager,
retries, resends and resolves. It publishes its queues into exporter.serve's state and
imports the layers under it.
"""
