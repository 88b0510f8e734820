"""Deploys announced by the Kubernetes downward API: the pod's annotations file, read on
every poll, bounded and never blocking (a FIFO, /dev/zero or a 2 GB file in its place is
one logged error, and the rules go on).
"""
from __future__ import annotations

import logging

from ..alerting.deploys import ANNOTATIONS, DeployEvent, parse_annotations
from ..peers import files

log = logging.getLogger(__name__)

# Kubernetes caps a pod's annotations at 256 KiB in all; the file adds quotes and escapes
MAX_ANNOTATIONS_BYTES = 1024 * 1024


class AnnotationsWatcher:
    """Reads the annotations file each poll; a change of the configured key is a deploy."""

    def __init__(self, path: str, key: str, target: str | None = None):
        self.path, self.key, self.target = path, key, target
        self._value: str | None = None
        self._read_once = False
        self._failing: str | None = None  # the read error last logged: said once, not on every poll

    def poll(self, now: float) -> list[DeployEvent]:
        try:
            value = parse_annotations(files.read_text(self.path, MAX_ANNOTATIONS_BYTES)).get(self.key)
        except OSError as exc:
            error = f"{self.path}: {exc.strerror or exc}"
            if error != self._failing:
                log.warning("deploy annotations unreadable, no deploy seen from them until they are: %s", error)
            self._failing = error
            return []
        if self._failing is not None:
            log.info("deploy annotations readable again: %s", self.path)
            self._failing = None
        return self.observe(now, value)

    def observe(self, now: float, value: str | None) -> list[DeployEvent]:
        first, self._read_once = not self._read_once, True
        old, self._value = self._value, value
        if first or value == old or value is None:
            return []
        return [DeployEvent(now, self.target, value, ANNOTATIONS, f"{self.key}: {old} -> {value}")]
