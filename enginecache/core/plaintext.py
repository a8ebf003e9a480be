"""User-supplied text made safe to show: no terminal escape codes, no forged lines, no markup.

Names, producers, file names and error messages that quote them come from uploaded files; in a
terminal a raw ESC or newline in them can rewrite what the operator sees, and in the dashboard
Markdown or HTML in them would render (an `<img src=...>` would be fetched by the browser).
"""

from __future__ import annotations

import re

# C0 controls (tab kept out too: it forges columns), DEL, C1 controls, and the Unicode line and
# paragraph separators and bidi overrides that reorder what a reader sees.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
# Every character Markdown (CommonMark and Streamlit's extensions) gives a meaning to.
_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~:$=])")


def printable(text: str) -> str:
    """`text` with every control character shown as an escape (`\\n`, `\\x1b`, `\\u202e`)."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def terminal_text(text: str) -> str:
    """`text` as a terminal may be given it: every line made `printable`, the line breaks between
    them kept. The one filter every text the CLI writes goes through (output, errors, progress)."""
    return "\n".join(printable(line) for line in text.split("\n"))


def markdown_literal(text: str) -> str:
    """`text` (made printable) with every Markdown meta-character backslash-escaped, so a name
    inside a Markdown string renders as those characters and never as markup, a link or an image."""
    return _MARKDOWN.sub(r"\\\1", printable(text))
