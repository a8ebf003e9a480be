"""`python -m enginecache.cli`."""

from enginecache.cli.app import main

main()
