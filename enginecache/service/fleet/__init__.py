"""The fleet: pull an engine onto a serving host, profiles and coverage per GPU class, exports
(Triton, per-hardware tree)."""
