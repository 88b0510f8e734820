"""The repository stands on its own: a user's clone has nothing beside it, so no file may
read or cite a path outside it, and every fixture copied from elsewhere names its source."""
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# A path that leaves the clone (../x), or the design notes and fact sheets that lived next
# to the repository while it was written and that no user has.
OUTSIDE = re.compile(r"\.\./shared|(?<![\w/])shared/(?:fixtures|schemas|[\w-]+\.md)|\bDESIGN\.md\b|parents\[2\]")


def tracked_files():
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / name for name in listed.decode().split("\0") if name]


def test_no_file_reads_or_cites_a_path_outside_the_repository():
    offenders = []
    for path in tracked_files():
        if not path.is_file() or path.stat().st_size > 2_000_000:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not offenders, "\n".join(offenders)


def test_every_copied_fixture_folder_names_its_sources():
    for folder in ("engine-metrics", "vllm-metrics", "schemas"):
        sources = ROOT / "tests" / "fixtures" / folder / "SOURCES.md"
        assert sources.is_file(), sources
        listed = sources.read_text()
        for fixture in sorted((ROOT / "tests" / "fixtures" / folder).iterdir()):
            if fixture.name != "SOURCES.md":
                assert fixture.name in listed, f"{fixture} is not named in {sources}"


def test_every_link_to_our_runbook_names_this_releases_tag():
    """`blob/main` is the next release's runbook: an alert of this one may be gone or renamed
    there. Every link we ship (rules, relay, the sidecar's default, the dashboard) names the
    tag CI pushes this version's image on."""
    import tomllib
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    ours = re.compile(r"github\.com/vllm-prefix-cache-exporter/vllm-prefix-cache-exporter/blob/([^/\s\"']+)/alerts/runbook\.md")
    tags = {}
    for path in tracked_files():
        if path.is_file() and path.suffix in (".yml", ".yaml", ".json", ".md", ".py") and "fixtures" not in path.parts \
                and path.parent.name != "tests":  # the tests spell it with the version they read
            for ref in ours.findall(path.read_text()):
                tags.setdefault(ref, set()).add(str(path.relative_to(ROOT)))
    assert set(tags) == {f"v{version}"}, tags
    from exporter.config.sections import load
    assert f"/blob/v{version}/" in load({}).rules.runbook_url
