"""Read models for the dashboard, one module per view: counts, aggregates and pages computed in SQL.

- `overview`: catalog counts by status, cache activity per day, recent failures.
- `models`: the model list with engine counts, a model's lineage.
- `engines`: one filtered page of engines, the filters' options, cache-key ingredients in order.
- `jobs`: queued and running jobs, jobs by id or by cache key (Build's matrix and progress).
- `timings`: build time and engine size per model x backend x targets x precision.
- `hosts`: the workers the catalog knows, with what each can build and load.
- `liveness`: when a worker counts as online (shared by `overview` and `hosts`).

Every function answers with a bounded result (GROUP BY or LIMIT), so a catalog with 10,000
engines and 100,000 jobs never ships its rows to the browser. Timestamps are UTC.
"""
