"""The policies themselves (fifo, edf, greedy, cpsat, oracle), the LP bound, and the steps
every plan shares: placement into Assignments, short-job packing, the finish and the guard."""
