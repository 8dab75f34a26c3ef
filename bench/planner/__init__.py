"""The planner benchmark: fifo, greedy and cpsat on generated instances vs a proven LP bound.

Run it with `python -m bench.planner` (see bench/README.md).
"""
