"""The `enginecache` command line: a peer of the dashboard on top of `enginecache.service`."""
