"""Slurm as carbonsched's executor: carbonsched plans which GPUs and when, Slurm runs the
jobs. This package is the shared core of it (no process code): running the Slurm tools,
reading Slurm's jobs and nodes, the `[slurm]` config table and adopting held `sbatch` jobs.
The node side (the executor backend and the agent that uses it) lives in `scheduler.node`.
"""
