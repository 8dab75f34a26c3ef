"""A job as the processes share it: `scheduler.jobs.job` holds the `Job` type (a stored job's
queue columns, built from a row in one function) and its one mapping to the policies'
`QueuedJob`; `scheduler.jobs.store` owns the SQL on the `jobs` table that the daemon's
planner and API service run (queue and plan reads and writes, submissions, holds,
cancellations, the reads behind `queue`, `show` and `health`).

State changes themselves go through `scheduler.lifecycle` (transitions and their
`job_events` rows), which stays the one place that moves a job from one state to another.
"""
