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

