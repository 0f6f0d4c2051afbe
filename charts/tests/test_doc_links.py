"""Every relative link of the README and docs/ reaches a file, and the heading it names: the reference moved from
the README into docs/, and a link that still names an old place would send a reader nowhere. Links from other pages
into the README and docs/ are held to the same."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from strata_testsupport.helm import REPO

README = REPO / "README.md"


def markdown_files() -> list[Path]:
    return [README, *sorted((REPO / "docs").glob("*.md"))]


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation but `-` and `_` dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> Iterator[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    text = re.sub(r"`[^`]*`", "", text)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if not re.match(r"[a-z]+:", target):
            yield target


def test_anchors_are_made_as_github_makes_them():
    assert slug("vLLM: `--load-format strata`") == "vllm---load-format-strata"
    assert slug("KV socket driver (`kvSocketDriver.enabled`)") == "kv-socket-driver-kvsocketdriverenabled"


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_reach_a_file_and_its_heading(path):
    broken = []
    for target in links(path):
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            broken.append(f"{target}: no {resolved.relative_to(REPO) if resolved.is_relative_to(REPO) else resolved}")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: {resolved.relative_to(REPO)} has no heading #{anchor}")
    assert not broken, "\n".join(broken)


def test_links_into_the_readme_and_docs_from_other_pages_still_land():
    """Sections moved from the README to docs/: a link elsewhere that names one must follow it."""
    broken = []
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files", "*.md"], capture_output=True, text=True, check=True)
    for path in (REPO / name for name in tracked.stdout.split()):
        if path in markdown_files():
            continue
        for target in links(path):
            file_part, _, anchor = target.partition("#")
            resolved = (path.parent / file_part).resolve()
            if resolved in markdown_files() and anchor and anchor not in anchors(resolved):
                broken.append(f"{path.relative_to(REPO)}: {target}")
    assert not broken, "\n".join(broken)
