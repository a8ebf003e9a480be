"""The job machinery: the worker, its claim loop, one attempt's child process and supervisor, the
job kinds' table, and what a worker can run (routing)."""
