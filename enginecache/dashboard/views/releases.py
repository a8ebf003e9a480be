"""The Releases panel of a model's page: its name's versions and aliases, promote and roll back.

What `enginecache release promote|rollback` does, through the same service calls (`service.models.releases`:
the `release` permission, operators and admins, checked there as well; each move audited). The buttons
are disabled for a role that may not release; the result of a move is shown in the state it produced
(the aliases table is read again after it).
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from enginecache.dashboard import data
from enginecache.service.context import AppContext
from enginecache.service.models.releases import ALIAS_PATTERN_HELP, aliases, promote, rollback, versions
from enginecache.service.readmodels.display import markdown_literal

EVERY_HOST = "every host"
DONE_KEY = "models_release_done"  # a roll back's outcome, shown after the rerun that redraws the table


def release_panel(app: AppContext, model_id: int, name: str) -> None:
    """Versions and aliases of `name`, model `model_id` one of its versions, with the promote form
    and a roll-back button per alias."""
    known = data.attempt("cannot read the versions", versions, app, name)
    if not known:
        return
    this = next((n for n, m in enumerate(known, start=1) if m.id == model_id), len(known))
    st.markdown(f"**Releases** of {markdown_literal(name)}: version {this} of {len(known)}")
    done = st.session_state.pop(DONE_KEY, None)
    if done:
        st.success(markdown_literal(str(done)))
    allowed = data.may("release")
    why = None if allowed else "your role may not release (operators and admins may)"
    moved = _promote_form(app, name, len(known), this, allowed, why)
    current = data.attempt("cannot read the aliases", aliases, app, name) or []
    if current:
        st.dataframe(
            pd.DataFrame(
                [
                    {
                        "alias": a.alias,
                        "for": a.gpu_class or EVERY_HOST,
                        "version": a.version,
                        "model id": a.model_id,
                        "this version": "yes" if a.model_id == model_id else "",
                    }
                    for a in current
                ]
            ),
            hide_index=True,
            key="models_aliases",
        )
        for a in current:
            shown = f"{a.alias}" + (f" for {a.gpu_class}" if a.gpu_class else "")
            key = f"models_rollback_{a.alias}_{a.gpu_class}"
            if st.button(f"Roll back {shown}", key=key, disabled=not allowed, help=why):
                gpu = a.gpu_class or None
                target = data.attempt(f"cannot roll back {shown}", rollback, app, name, a.alias, gpu_class=gpu)
                if target is not None:
                    data.clear_caches()
                    st.session_state[DONE_KEY] = f"{name}@{shown} now points at version {target.version}"
                    st.rerun()
    else:
        st.caption("No aliases yet: promote a version (`prod`, `canary`); pull and load_or_build resolve NAME@ALIAS.")
    if moved is not None:
        st.success(markdown_literal(moved))


def _promote_form(app: AppContext, name: str, count: int, this: int, allowed: bool, why: str | None) -> str | None:
    """The promote form; what it did, where it did something."""
    with st.form("models_promote", border=True):
        cols = st.columns(3)
        alias = cols[0].text_input("Alias", value="prod", help=ALIAS_PATTERN_HELP)
        version = cols[1].selectbox("Version", list(range(count, 0, -1)), index=count - this)
        gpu_class = cols[2].text_input("GPU class (optional)", value="", help="e.g. sm86: only hosts of that class")
        submitted = st.form_submit_button("Promote", disabled=not allowed, help=why)
    if not submitted:
        return None
    gpu = gpu_class.strip() or None
    chosen = int(version)
    target = data.attempt(f"cannot promote {alias}", promote, app, name, alias.strip(), version=chosen, gpu_class=gpu)
    if target is None:
        return None
    data.clear_caches()
    where = f" for {target.gpu_class}" if target.gpu_class else ""
    return f"{name}@{target.alias}{where} now points at version {target.version}"
