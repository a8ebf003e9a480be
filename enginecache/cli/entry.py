"""The `enginecache` console script: the readiness probe first, then the full CLI.

`enginecache ready --state FILE` is what Kubernetes runs every few seconds, so it is answered
before Typer (or anything but the standard library) is imported; every other command goes to
`enginecache.cli.app`.
"""

from __future__ import annotations

import sys


def main() -> None:
    from enginecache.cli.probe import fast_main

    code = fast_main(sys.argv[1:])
    if code is not None:
        sys.exit(code)
    from enginecache.cli.app import main as cli_main

    cli_main()
