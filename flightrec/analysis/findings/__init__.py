"""The candidates: one module per family of finding kinds, each with a ``find_*`` that returns
its findings and the ``Evidence`` subclass they carry (``kinds.KINDS`` names which module
makes which kind)."""
