"""The `enginecache` console script: the readiness probe first, then the full CLI.

`enginecache ready --state FILE` is what Kubernetes runs every few seconds, so it is answered
before Typer (or anything but the standard library) is imported; every other command goes to
`enginecache.cli.app`, and ends without the interpreter's last walk over every object it made
(`cli.exiting`).
"""

from __future__ import annotations

import sys


def main() -> None:
    from enginecache.cli.probe import fast_main

    code = fast_main(sys.argv[1:])
    if code is not None:
        sys.exit(code)
    from enginecache.cli.app import main as cli_main
    from enginecache.cli.exiting import leave_objects_out_of_the_exit_collection

    try:
        cli_main()
    finally:
        leave_objects_out_of_the_exit_collection()
