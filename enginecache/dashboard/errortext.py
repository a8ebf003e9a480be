"""Errors for people: the one line an error shows (its first line, no server path, no library's
own words) and the details kept for an expander (the whole text, server paths still left out)."""

from __future__ import annotations

import re
from pathlib import Path

# A trailing parenthesis quoting a library's own words ("(protobuf says: Error parsing message ...)"):
# the details, not the cause.
LIBRARY_SAYS = re.compile(r"\s*\((?:[^()]*\bsays?:[^()]*)\)\s*$")
LINE_LIMIT = 1000  # characters of the one line (room for a path and the import roots); the rest is in the details


def without_server_paths(text: str, home: Path, tmp_dir: Path) -> str:
    """`text` with the server's own folders left out: an upload's staging folder
    (`<tmp_dir>/upload-XXXX/upload/`) dropped before the file's name, `home` before a path inside
    it (left relative)."""
    text = re.sub(re.escape(str(tmp_dir)) + r"/upload-[^/\s]+/upload/", "", text)
    return re.sub(re.escape(str(home).rstrip("/")) + "/", "", text)


def one_line(text: str) -> str:
    """The cause in one line: the text's first non-empty line without a library's own words,
    cut at LINE_LIMIT characters (an ellipsis where cut)."""
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    first = LIBRARY_SAYS.sub("", first)
    return first if len(first) <= LINE_LIMIT else first[: LINE_LIMIT - 1].rstrip() + "…"
