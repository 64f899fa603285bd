"""The hot path: the code that runs around every traced torch.distributed call, and its state.

- ``state.py``: ``HotState``, exactly what recording one call reads and calls (the ring, the
  reentrancy guard, the caches, and the slow paths as plain callables), never the recorder;
- ``python.py``: ``PyPath.enter``/``leave``/``write``, the definition of what an entry holds
  and the path every call can take;
- ``_fast.c`` (optional, built by ``pip install``): the same ``enter``/``leave`` in C, and the
  ``Site`` that puts them in front of single-tensor collectives with no Python frame; on any
  cache miss it hands the call to the Python path before consuming anything;
- ``ring.py``: the ring of binary slots; ``Ring.append``/``finish``, the one Python
  definition of a slot write;
- ``groups.py``: process-group identity and the sequence counters the hot path advances;
- ``counters.py``: the counters and the reentrancy guard (C types where built);
- ``layout.py``: where torch keeps a tensor's shape and dtype, for the C path.

The wrappers that call into it are generated in ``flightrec.recorder.hooks.codegen``; the
slow paths are the ``Recorder``'s (``flightrec.recorder.recording``).
tests/integration/test_recorder_fast.py and test_recorder_hooks.py run one suite against both
paths.
"""
