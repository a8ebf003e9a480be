"""The table of published TensorRT-RTX runtime caches, as the Hosts view (every engine's) and the
engine page (one engine's, per GPU) draw it: one row per cache of
`service.fleet.runtimecaches.runtime_cache_rows`, its key (GPU SKU, SM, TensorRT-RTX and CUDA
versions), size and who published it from which host, when. Values are plain text in a dataframe."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import streamlit as st


def cache_table_rows(rows: Sequence[Mapping[str, Any]], *, with_engine: bool) -> list[dict[str, Any]]:
    """The table's rows for `rows` (`runtime_cache_dict`s); `with_engine` leads each with its engine."""
    return [
        {
            **({"engine": r["engine_id"]} if with_engine else {}),
            "GPU": r["gpu_sku"],
            "SM": r["compute_capability"],
            "TensorRT-RTX": r["rtx_version"],
            "CUDA": r["cuda_version"],
            "bytes": r["size_bytes"],
            "sha256": str(r["sha256"])[:12],
            "from host": r["host"],
            "by": r["actor"],
            "at": r["created_at"],
        }
        for r in rows
    ]


def cache_table(title: str, rows: Sequence[Mapping[str, Any]], *, key: str, when_empty: str, with_engine: bool) -> None:
    """`title`, then the table of `rows`, or `when_empty` where there are none."""
    st.markdown(title)
    if rows:
        st.dataframe(pd.DataFrame(cache_table_rows(rows, with_engine=with_engine)), hide_index=True, key=key)
    else:
        st.caption(when_empty)
