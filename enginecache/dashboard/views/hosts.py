"""Hosts: each worker's fingerprint, last heartbeat, and what it can build and load."""

from __future__ import annotations

from datetime import UTC, datetime

import pandas as pd
import streamlit as st

from enginecache.dashboard import data
from enginecache.dashboard.views.runtimecachetable import cache_table
from enginecache.service.fleet.hostcoverage import HostCoverage, hosts_coverage
from enginecache.service.fleet.runtimecaches import runtime_cache_rows
from enginecache.service.readmodels.display import markdown_literal


def render() -> None:
    _, hosts = data.start_view(
        "Hosts",
        data.worker_hosts,
        "No worker has registered yet: `enginecache worker` (or `enginecache serve`) starts one.",
    )
    if not hosts:
        _runtime_caches()
        return
    now = datetime.now(UTC)
    app = data.get_app()
    reach: dict[str, HostCoverage] = (
        data.attempt("cannot read what the hosts can load", hosts_coverage, app, hosts) or {}
    )
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "worker": h.name,
                    "host": h.hostname,
                    "online": h.online,
                    "last heartbeat": f"{(now - h.heartbeat_at).total_seconds():.0f} s ago",
                    "current job": h.current_job_id,
                    "GPUs": ", ".join(
                        f"{g.get('name')} {str(g.get('compute_capability')).upper()}"
                        for g in h.fingerprint.get("gpus", [])
                    )
                    or "none",
                    "CPU": h.capabilities.get("cpu_target"),
                    "loads": len(found.loadable) if (found := reach.get(h.name)) else None,
                    "lacks": len(found.lacking) if found else None,
                    "can build": "; ".join(h.can_build),
                    "can load": "; ".join(h.can_load),
                }
                for h in hosts
            ]
        ),
        hide_index=True,
        key="hosts_table",
        column_config={
            "loads": st.column_config.NumberColumn(help="groups of READY engines this host can load (below)"),
            "lacks": st.column_config.NumberColumn(
                help="models x backend x precision with READY engines, none of which this host can load"
            ),
        },
    )
    labels = {h.name: f"{h.name} ({'online' if h.online else h.status})" for h in hosts}
    name = st.selectbox("Worker", list(labels), format_func=lambda n: labels[n], key="hosts_detail")
    host = next(h for h in hosts if h.name == name)
    fp = host.fingerprint
    st.subheader(host.name)
    cols = st.columns(4)
    cols[0].metric("Status", "online" if host.online else host.status)
    cols[1].metric(
        "Last heartbeat",
        f"{(now - host.heartbeat_at).total_seconds():.0f} s ago",
        help=host.heartbeat_at.strftime("%Y-%m-%d %H:%M:%S UTC"),
    )
    cols[2].metric("OS", f"{fp.get('os', '-')} {fp.get('machine', '')}")
    cols[3].metric("GPUs", len(fp.get("gpus") or []))
    st.markdown(f"**CPU** {markdown_literal(str(fp.get('cpu_model', '-')))} (`{host.capabilities.get('cpu_target')}`)")
    driver = fp.get("driver_version")
    st.markdown(
        f"**NVIDIA driver** {driver} (CUDA {fp.get('cuda_driver_version')})"
        if driver
        else f"**NVIDIA driver** none ({fp.get('nvml', 'NVML unavailable')})"
    )
    st.markdown("**Can build:** " + ("; ".join(host.can_build) or "nothing"))
    st.markdown("**Can load:** " + ("; ".join(host.can_load) or "nothing"))
    found = reach.get(host.name)
    if found is not None:
        _engines(found)
    packages = fp.get("packages") or {}
    if packages:
        st.dataframe(
            pd.DataFrame([{"package": k, "version": v or "not installed"} for k, v in packages.items()]),
            hide_index=True,
            key="hosts_packages",
        )
    with st.expander("Full fingerprint"):
        st.json(fp)
    _runtime_caches()


def _runtime_caches() -> None:
    """The TensorRT-RTX runtime caches serving hosts published, per engine and GPU (docs/fleet.md)."""
    st.subheader("Runtime caches")
    rows = data.attempt("cannot read the runtime caches", runtime_cache_rows, data.get_app()) or []
    st.caption(
        "TensorRT-RTX kernels compiled by a serving host, reused by others with the same GPU (same SM, "
        "TensorRT-RTX and CUDA at least as new)."
    )
    cache_table(
        f"**Published** ({len(rows)})",
        rows,
        key="hosts_runtime_caches",
        when_empty="None published yet: `enginecache runtime-cache publish ENGINE_ID FILE` on a host that loaded "
        "an RTX engine.",
        with_engine=True,
    )


def _engines(found: HostCoverage) -> None:
    """The READY engines this host can load, and the model x backend x precision READY elsewhere
    that it cannot load any engine of (the backend's rule, on this host's recorded fingerprint)."""
    loadable = [
        {
            "loads engine": e.engine_id,
            "model": e.model,
            "backend": e.backend,
            "precision": e.precision,
            "targets": e.targets,
            "version": e.backend_version,
            "engines": e.count,
        }
        for e in found.loadable
    ]
    lacking = [
        {
            "model": e.model,
            "backend": e.backend,
            "precision": e.precision,
            "newest engine": e.engine_id,
            "targets": e.targets,
            "why": e.reason,
        }
        for e in found.lacking
    ]
    _table(
        f"**Engines it can load** ({len(loadable)} group(s) of READY engines)",
        loadable,
        "hosts_loadable",
        "None of the READY engines: see what it lacks below.",
    )
    _table(
        f"**READY elsewhere, none it can load** ({len(lacking)})",
        lacking,
        "hosts_lacking",
        "Nothing: it can load an engine of every model and precision that has a READY one.",
    )


def _table(title: str, rows: list[dict[str, object]], key: str, when_empty: str) -> None:
    st.markdown(title)
    if rows:
        st.dataframe(pd.DataFrame(rows), hide_index=True, key=key)
    else:
        st.caption(when_empty)
