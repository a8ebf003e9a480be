"""An interpreter that starts as a user's regular install of enginecache starts: for measuring, and
testing, what a new process imports (bench/bench_start.py's children, tests/test_hitpath.py).

Standard library only: bench/harness.py re-exports it.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path


def installed_python(folder: Path, package: Path) -> str:
    """An interpreter that sees `package` as a user's regular (non-editable) install does: a venv in
    `folder` (no pip) whose site-packages links every entry of ours except an editable install's
    `__editable__*` finder and `.pth`, with `package` linked in by its name where it is not there.

    Why: with the checkout installed editable (`pip install -e .`), the `.pth` the interpreter runs at
    start imports the finder, and with it `pathlib`, `fnmatch`, `re`, `urllib.parse`, `ipaddress`,
    `importlib.util` (~10 ms a start): a cost a regular install does not have, and one that hides
    the modules the code under test imports itself. The same interpreter, the same libraries, the
    same files (linked, not copied), only started as a user's install starts it. Children of both
    commands of a figure run it, so floors and ours alike."""
    ours = Path(sysconfig.get_paths()["purelib"])
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    theirs = Path(subprocess.run([python, "-c", code], check=True, capture_output=True, text=True).stdout.strip())
    for entry in ours.iterdir():
        if entry.name.startswith("__editable__") or entry.name == "__pycache__":
            continue
        (theirs / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    if not (theirs / package.name).exists():
        (theirs / package.name).symlink_to(package, target_is_directory=True)
    return str(python)
