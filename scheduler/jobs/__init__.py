"""A job as the processes share it: `scheduler.jobs.job` holds the `Job` type (a stored job's
queue columns, built from a row in one function) and its one mapping to the policies'
`QueuedJob`; `scheduler.jobs.store` owns the SQL on the `jobs` table that the daemon (its
planner, API service and keepers) and the node agent's claims and reconciler run (queue and
plan reads and writes, submissions, holds, cancellations, the reads behind `queue`, `show`
and `health`, due and running jobs). The read and report side asks its own questions in
modules of their own: `views` (the columns `queue` and `show` list), `history` (what
completed jobs did, for the learned profiles and shadow mode), `sums` (accounting's sums
over a period's finished jobs, the metrics' totals) and `pricing` (the ledger's reads and
writes of a job's carbon). The Slurm adoption still holds its own.

State changes themselves go through `scheduler.lifecycle` (transitions and their
`job_events` rows), which stays the one place that moves a job from one state to another.
"""
