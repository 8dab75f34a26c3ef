"""What runs on a GPU node (`carbonsched agent`, or in-process in a single-node daemon): the
agent process's wiring (`main`), the agent that registers GPUs, claims planned jobs and
records energy (`agent`), jobs run as their owners (`executor`) under a supervisor that
outlives the agent (`supervise`), and the power-sample store (`samples`).

It shares state with the daemon only through the store, and imports nothing from
`scheduler.daemon` or `scheduler.cli`.
"""
