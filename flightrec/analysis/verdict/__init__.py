"""From candidates to a verdict: the root-cause arbitration over the wait-for graph's ends, then
the refinements (consequences folded into the root cause, skipped calls found)."""
