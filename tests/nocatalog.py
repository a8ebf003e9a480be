"""A catalog nobody serves, for the tests of an unreachable catalog (tests/test_cli_exit_codes.py,
tests/test_oneshot_children.py)."""

NOBODY = "postgresql://postgres:hunter2@127.0.0.1:1/nope"  # nothing listens on port 1
