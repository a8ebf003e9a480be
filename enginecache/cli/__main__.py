"""`python -m enginecache.cli`."""

from enginecache.cli.entry import main

main()
