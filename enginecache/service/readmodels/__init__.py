"""Read models for the dashboard, one module per view: counts, aggregates and pages computed in SQL.

- `overview`: catalog counts by status, cache activity per day, recent failures.
- `models`: the model list with engine counts, a model's lineage.
- `engines`: one filtered page of engines, the filters' options, cache-key ingredients in order.
- `jobs`: queued and running jobs, jobs by id or by cache key (Build's matrix and progress).
- `timings`: build time and engine size per model x backend x targets x precision; the
  `load_or_build` hit rate per day of the busiest model and host pairs.
- `hosts`: the workers the catalog knows, with what each can build and load.
- `liveness`: when a worker counts as online (shared by `overview` and `hosts`).
- `days`: a window's UTC days and rows counted per day in SQL (one index range per day).

Every function answers with a bounded result (GROUP BY or LIMIT), so a catalog with 100,000
engines, 100,000 jobs and 1,000,000 load events never ships its rows to the browser, and each
reads an index made for it (migrations 0003 and 0008) rather than the tables' rows: an engine row
carries its build host's fingerprint and builder log. Timestamps are UTC.
"""
