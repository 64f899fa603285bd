"""The wait-for graph: who is blocked, in what, waiting on whom, and its data structure."""
