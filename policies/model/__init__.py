"""The energy and performance model: the hardware catalog, how fast and at what power a
job runs on a GPU model, what that emits, and what this cluster has learned from its own runs."""
