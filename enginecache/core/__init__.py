"""enginecache core: the build/load library (no database, no Streamlit)."""
