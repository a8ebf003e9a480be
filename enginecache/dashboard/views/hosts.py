"""Hosts: each worker's fingerprint, last heartbeat, and what it can build and load."""

from __future__ import annotations

from datetime import UTC, datetime

import pandas as pd
import streamlit as st

from enginecache.core.plaintext import markdown_literal
from enginecache.dashboard import data


def render() -> None:
    _, hosts = data.start_view(
        "Hosts",
        data.worker_hosts,
        "No worker has registered yet: `enginecache worker` (or `enginecache serve`) starts one.",
    )
    if not hosts:
        return
    now = datetime.now(UTC)
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
                    "can build": "; ".join(h.can_build),
                    "can load": "; ".join(h.can_load),
                }
                for h in hosts
            ]
        ),
        hide_index=True,
        key="hosts_table",
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
    packages = fp.get("packages") or {}
    if packages:
        st.dataframe(
            pd.DataFrame([{"package": k, "version": v or "not installed"} for k, v in packages.items()]),
            hide_index=True,
            key="hosts_packages",
        )
    with st.expander("Full fingerprint"):
        st.json(fp)
