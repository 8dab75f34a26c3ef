"""A job as the processes share it, and the one home of the SQL on the `jobs` table.

`scheduler.jobs.job` holds the `Job` type (a stored job's queue columns, built from a row in
one function), its one mapping to the policies' `QueuedJob`, and `RunningJob` (a running job
as the node agent reads it). `scheduler.jobs.store` owns the SQL that the daemon (its
planner, API service and keepers) and the node agent run: queue and plan reads and writes,
submissions, holds, cancellations, the reads behind `queue`, `show` and `health`, due and
running jobs, what a run that ended writes back, adopted and observed Slurm jobs. The read
and report side asks its own questions in modules of their own: `views` (the columns `queue`
and `show` list), `history` (what completed jobs did, for the learned profiles and shadow
mode), `sums` (accounting's sums over a period's finished jobs, the metrics' totals) and
`pricing` (the ledger's reads and writes of a job's carbon). No module outside this package,
`scheduler.lifecycle` and `scheduler.store` touches the table
(`tests/project/test_jobs_home.py`).

State changes themselves go through `scheduler.lifecycle` (transitions and their
`job_events` rows), which stays the one place that moves a job from one state to another.
"""
