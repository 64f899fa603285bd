"""The candidates: one module per family of finding kinds, each with the finders its kinds'
rows name (``kinds.KINDS``: which module makes which kind, with which finder, in which order)
and the ``Evidence`` subclasses they carry. Only ``pipeline`` and ``verdict/`` import these;
what others share is in ``analysis/facts``."""
