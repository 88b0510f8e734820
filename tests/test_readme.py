"""The README is what a newcomer reads first: its facts are checked here."""
from pathlib import Path

from exporter.collector import METRICS

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()


def test_every_metric_of_ours_is_documented():
    for d in METRICS.values():
        assert f"`{d.exposed_name}" in README, d.exposed_name


def test_ci_runs_the_readme_test_command():
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.strip() and not line.startswith(("#", "set ", "cd "))]
    assert ci[-1] in README
