"""What runs in the head-node daemon (`carbonsched daemon`, one per cluster): its wiring and
main loop (`main`), the API socket server (`api`) and the request handling behind it
(`service`), the planner loop (`planner`) and the child process it runs in
(`planner_process`), and the reaper of silent nodes (`watchdog`).

With SQLite the daemon also runs a node agent in-process, so it imports `scheduler.node`;
nothing in `scheduler.node` imports this package.
"""
