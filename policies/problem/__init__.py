"""The planning problem a solver is given: the slot grid, the fleet's pools and groups, what
already holds its GPUs, and the queue as arrays, built once per tick from a Snapshot."""
