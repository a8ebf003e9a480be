"""Models: register (inspect, hash, store, record), verify and repair a stored bundle, and
releases (versions and aliases)."""
