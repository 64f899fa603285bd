"""Facts the finding modules, the rank states, the renderers and the in-job verdict share:
how a rank's process ended (``deaths``), where a culprit was and what it owed (``culprits``),
where a stack stands (``places``), arrival lateness and its statistics (``lateness``).

Nothing here makes a finding; the finding modules under ``analysis/findings`` build on these,
and only ``pipeline`` and ``verdict/`` import those.
"""
