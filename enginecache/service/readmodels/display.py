"""How the CLI and the dashboard show text that came from users or the catalog: `printable` (every
control character escaped, for a terminal), `markdown_literal` (that, with every Markdown
meta-character escaped, for Streamlit), `shape_text` (a tensor shape as people read it, `batch x 3 x height x width`).

Imports only the standard library, so a read command that shows text stays light.
"""

from __future__ import annotations

from enginecache.core.plaintext import markdown_literal, printable, terminal_text
from enginecache.core.shapetext import shape_text

__all__ = ["markdown_literal", "printable", "shape_text", "terminal_text"]
