"""What runs on a GPU node (`carbonsched agent`, or in-process in a single-node daemon): the
agent process's wiring (`main`), the agent that registers GPUs, claims planned jobs and
records energy (`agent`, with its parts: `config`, `registration`, `claims`, `launch`,
`reconcile`, `job_ends`, `run_energy`, `power_limits`, `heartbeat`, `disk`), how its jobs
run (`launcher`: local processes as their owners through `executor`, under a supervisor that
outlives the agent, `supervise`; or Slurm jobs, `slurm_launcher` + `slurm_executor`), and
the power-sample store (`samples`).

It shares state with the daemon only through the store, and imports nothing from
`scheduler.daemon` or `scheduler.cli`.
"""
