"""Garbage collection of the store (`enginecache gc`): what it reads, plans, removes and reports."""
