"""Wrapping torch.distributed: which functions are traced and how a call reaches the hot path.

- ``specs.py``: what each traced function takes (which argument is the group, the tensors, the
  root...);
- ``codegen.py``: one wrapper per function, generated from the installed torch's signature,
  recording through the hot path (``flightrec.recorder.hotpath``);
- ``install.py``: ``Hooks``, putting the wrappers in place of torch's functions and back;
- ``ddp.py``: DistributedDataParallel's gradient all-reduces.
"""
