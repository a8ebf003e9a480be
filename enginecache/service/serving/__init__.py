"""Serving: `load_or_build` and what a serving process reads on its way to a loaded engine
(the hit path, the full path, the verified load, the pulled folder, the state file a probe checks)."""
