"""Builds and test-loads: plan a build (the cache key), submit it, run it as a job, prebuild a
matrix, and test-load an engine."""
