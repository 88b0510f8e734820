"""exporter/config/load.py: a config file is read bounded and never blocking, and every way
it can fail is one clear ConfigError: from `check-config`, from `run` and on a SIGHUP reload."""
import signal
import subprocess
import sys
import time

import pytest
import requests
import yaml

from exporter import cli
from exporter.config.load import load_file
from exporter.config.sections import ConfigError

from conftest import free_port, hostile_files, wait_for
from test_yamltext import alias_bomb

GOOD = {"global": {"poll_interval": "500ms", "read_timeout": "1s", "connect_timeout": "500ms"},
        "targets": [{"name": "dead", "url": "http://127.0.0.1:9/metrics"}]}


def hostile_configs(tmp_path):
    """(path, what the error says) for each file a config path can name by mistake or malice."""
    deep = tmp_path / "deep.yml"
    deep.write_text("targets: " + "[" * 5000 + "]" * 5000 + "\n")
    bomb = tmp_path / "bomb.yml"
    bomb.write_text(alias_bomb())
    return hostile_files(tmp_path, b"targets:\n- name: caf\xe9\n  url: http://127.0.0.1:9/metrics\n") + [
        (deep, "nested deeper than 64 levels"), (bomb, "once its aliases are expanded")]


def test_every_hostile_file_is_one_config_error_naming_it(tmp_path):
    for path, why in hostile_configs(tmp_path):
        start = time.monotonic()
        with pytest.raises(ConfigError) as exc:
            load_file(str(path))
        assert time.monotonic() - start < 2.0, path
        (error,) = exc.value.errors
        assert error.startswith(str(path)) and why in error, error


def test_check_config_says_what_is_wrong_in_one_line_and_exits_2(tmp_path, capsys):
    for path, why in hostile_configs(tmp_path):
        assert cli.main(["check-config", str(path)]) == 2
        err = capsys.readouterr().err
        assert why in err and "Traceback" not in err, err


@pytest.mark.slow
def test_a_sighup_onto_a_hostile_config_keeps_the_old_one_and_says_so(tmp_path):
    cfg = tmp_path / "config.yml"
    cfg.write_text(yaml.safe_dump(GOOD))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "run", f"--config.file={cfg}", f"--web.listen-address=127.0.0.1:{port}"],
                            stderr=subprocess.PIPE, text=True)
    metric = lambda: requests.get(base + "/metrics", timeout=2).text
    hostile_files = hostile_configs(tmp_path)
    try:
        assert wait_for(lambda: "prefixcache_config_last_reload_successful 1.0" in metric())
        for hostile, _ in hostile_files:
            cfg.unlink()
            cfg.symlink_to(hostile)
            proc.send_signal(signal.SIGHUP)
            assert wait_for(lambda: "prefixcache_config_last_reload_successful 0.0" in metric(), timeout=10), hostile
            cfg.unlink()
            cfg.write_text(yaml.safe_dump(GOOD))
            proc.send_signal(signal.SIGHUP)
            assert wait_for(lambda: "prefixcache_config_last_reload_successful 1.0" in metric(), timeout=10), hostile
            assert requests.get(base + "/-/healthy", timeout=2).status_code == 200
        stopping = time.monotonic()
        proc.terminate()
        _, err = proc.communicate(timeout=30)
        assert time.monotonic() - stopping < 8.0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == 0 and "Traceback" not in err, err
    failures = [line for line in err.splitlines() if "reload failed, keeping the old config" in line]
    assert len(failures) == len(hostile_files), failures
    for (hostile, why), line in zip(hostile_files, failures):
        assert why in line, line
