"""``flightrec attach``: snapshots of a running job's ranks taken from outside (no tracing).

Reads stacks with py-spy and, where the job serves it, torch's own ring; writes one flightrec
dump per rank (reason ATTACHED) through ``flightrec.format``, reading torch's ring through
``flightrec.readers.native``. Needs neither torch nor the analysis; ``session.attach`` is the
entry point.
"""
