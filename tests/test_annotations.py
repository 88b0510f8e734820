"""exporter/discovery/annotations.py: deploys announced through the downward API's annotations file."""
import os
import time

import pytest

from exporter.alerting import deploys
from exporter.discovery.annotations import AnnotationsWatcher

from conftest import hostile_files


def test_annotations_watcher_reports_changes_not_the_first_read(tmp_path, caplog):
    path = tmp_path / "annotations"
    caplog.set_level("INFO", logger="exporter.discovery.annotations")
    w = AnnotationsWatcher(str(path), "app.kubernetes.io/version")
    assert w.poll(1.0) == [] and w.poll(1.5) == []
    unreadable = [r.getMessage() for r in caplog.records if "unreadable" in r.getMessage()]
    assert len(unreadable) == 1 and "No such file" in unreadable[0], "said once, not on every poll"
    path.write_text('app.kubernetes.io/version="v41"\n')
    assert w.poll(2.0) == []
    assert w.poll(3.0) == []
    path.write_text('app.kubernetes.io/version="v42"\n')
    (e,) = w.poll(4.0)
    assert (e.t, e.version, e.source, e.target) == (4.0, "v42", deploys.ANNOTATIONS, None)
    assert any("readable again" in r.getMessage() for r in caplog.records)


def test_a_fifo_dev_zero_non_utf8_or_2_gb_annotations_file_is_one_logged_error_and_the_poll_goes_on(tmp_path, caplog):
    caplog.set_level("WARNING", logger="exporter.discovery.annotations")
    for path, why in hostile_files(tmp_path, b'app.kubernetes.io/version="caf\xe9"\n'):
        w = AnnotationsWatcher(str(path), "app.kubernetes.io/version")
        start = time.monotonic()
        assert w.poll(1.0) == [] and w.poll(2.0) == []
        assert time.monotonic() - start < 1.0, f"{path}: the poll waited on the file"
        said = [r.getMessage() for r in caplog.records if str(path) in r.getMessage()]
        assert len(said) == 1 and why in said[0], said


@pytest.mark.slow
def test_the_sidecar_evaluates_its_rules_with_a_fifo_for_an_annotations_file(tmp_path):
    """Before, the poll opened the FIFO and waited for a writer forever: no rule ran again."""
    import signal
    import subprocess
    import sys

    import requests
    import yaml

    from conftest import free_port, wait_for

    fifo = tmp_path / "annotations"
    os.mkfifo(fifo)
    cfg = tmp_path / "config.yml"
    cfg.write_text(yaml.safe_dump({
        "global": {"poll_interval": "500ms", "read_timeout": "1s", "connect_timeout": "500ms"},
        "targets": [{"name": "dead", "url": f"http://127.0.0.1:{free_port()}/metrics"}],
        "deploys": {"annotations_file": str(fifo)},
        "rules": {"target_down": {"for": "0s", "startup_grace": "0s"}},
    }))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "run", f"--config.file={cfg}", f"--web.listen-address=127.0.0.1:{port}"],
                            stderr=subprocess.PIPE, text=True)
    def fired() -> bool:
        return any(line.startswith("prefixcache_alert_state{") and 'alertname="PrefixCacheTargetDown"' in line and 'state="firing"' in line
                   for line in requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text.splitlines())
    try:
        assert wait_for(fired, timeout=20)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert sum("deploy annotations unreadable" in line for line in err.splitlines()) == 1, err
