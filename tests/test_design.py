"""docs/DESIGN.md's house table names every module of the package, in the folder it lives in."""

from __future__ import annotations

import re
from pathlib import Path

import deltaflow

ROOT = Path(deltaflow.__file__).parent
DESIGN = ROOT.parent / "docs" / "DESIGN.md"


def _house() -> dict[str, set[str]]:
    """Layer folder (or '' for top-level modules) -> the module names its table row lists."""
    text = DESIGN.read_text()
    section = text[text.index("## The house") :]
    section = section[: section.index("\n## ", 1)]
    rows: dict[str, set[str]] = {}
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        folders = [f.strip("`/ ") for f in re.findall(r"`([^`]+)`", cells[0])]
        groups = cells[1].split("\\|")
        for folder, names in zip(folders, groups, strict=False):
            key = folder if (ROOT / folder).is_dir() else ""
            rows.setdefault(key, set()).update(re.findall(r"`([^`]+)`", names))
    return rows


def test_the_house_table_names_every_module():
    house = _house()
    missing = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.name == "__init__.py" or rel.parts[0] in ("_version.py", "testing.py"):
            continue
        folder = rel.parts[0] if len(rel.parts) > 1 else ""
        if rel.stem not in house.get(folder, set()):
            missing.append(str(rel))
    assert not missing, f"docs/DESIGN.md's house table does not name: {missing}"
