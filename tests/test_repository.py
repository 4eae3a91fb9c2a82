"""The tracked files are whole: no merge left its conflict markers behind."""
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^(<{7} |>{7} |={7}$)", re.M)


def test_no_conflict_markers_in_tracked_files():
    files = subprocess.run(["git", "ls-files", "*.py", "*.md", "*.ipynb", "*.toml", "*.yml",
                            "*.json", "scripts/*"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    marked = [f for f in files if (ROOT / f).is_file()
              and MARKER.search((ROOT / f).read_text(errors="replace"))]
    assert not marked, f"merge conflict markers in {marked}"
