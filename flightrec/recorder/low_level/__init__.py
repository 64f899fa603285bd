"""Recording one call: the code that runs around every traced torch.distributed call.

- ``python.py``: ``PyPath.enter``/``leave``/``write``, the definition of what an entry holds
  and the path every call can take;
- ``_fast.c`` (optional, built by ``pip install``): the same ``enter``/``leave`` in C, and the
  ``Site`` that puts them in front of single-tensor collectives with no Python frame; on any
  cache miss it hands the call to the Python path before consuming anything;
- ``codegen.py``: the wrappers, generated from the installed torch's signatures, that bind a
  call's arguments and record through the Python path (behind a C Site where one applies).

The rest of the recorder (tables, groups, ring, completion tracking) is what both read and
call on misses. tests/integration/test_recorder_fast.py and test_recorder_hooks.py run one
suite against both paths.
"""
