"""Shapes as people read them: `batch x 3 x 48 x width`, not `[DynamicDimension.0, 3, 48, DynamicDimension.1]`.

Exporters name dynamic dims with generated tokens (`p2o.DynamicDimension.0`, `unk__214`, `?`,
`floor(...)`) that say nothing; a dim named by a person (`batch`, `sequence`) keeps its name. A
generated one is named by its place: the first dim of a tensor of rank >= 2 is `batch`; in an
image-like tensor (rank 4 with 1, 3 or 4 channels second) the last two are `height` and `width`;
in a rank-3 tensor after a batch the second is `sequence`; otherwise `dim<i>`. The recorded names
stay as they are in the catalog; this is display only.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# A name a person chose: letters, digits and underscores, starting with a letter, and not one of
# the tokens exporters generate.
_READABLE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_GENERATED = re.compile(r"^(unk__\d+|dim_?\d+|d\d+|N|DynamicDimension\w*|input_dynamic_axes_\d+|Unsqueeze\w*)$")
IMAGE_CHANNELS = (1, 3, 4)


def readable_dim(dim: int | str, index: int, shape: Sequence[int | str]) -> str:
    """One dim as text: its size, the name a person gave it, or a name from its place."""
    if isinstance(dim, int) and dim >= 0:
        return str(dim)
    name = str(dim)
    if _READABLE.match(name) and not _GENERATED.match(name):
        return name
    return _positional_name(index, shape)


def _positional_name(index: int, shape: Sequence[int | str]) -> str:
    rank = len(shape)
    if index == 0 and rank >= 2:
        return "batch"
    if rank == 4 and shape[1] in IMAGE_CHANNELS and index in (2, 3):
        return ("height", "width")[index - 2]
    if rank == 3 and index == 1:
        return "sequence"
    return f"dim{index}"


def shape_text(shape: Sequence[int | str]) -> str:
    """`batch x 3 x 48 x width`; `scalar` for a rank-0 tensor."""
    if not shape:
        return "scalar"
    return " x ".join(readable_dim(dim, index, shape) for index, dim in enumerate(shape))
