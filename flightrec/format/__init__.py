"""The dump format, in one place: everything that writes or reads flightrec's files builds on it.

- ``flightrec_pb2``: the generated protobuf module for ``proto/flightrec.proto`` (regenerate
  with ``python proto/generate.py``);
- ``schema``: magic bytes, schema version, file names, size limits;
- ``builder``: ``DumpBuilder``, which interns and fills the columns every producer writes;
- ``write`` / ``read``: dump-file I/O (atomic write; parse and validate);
- ``wire``: the columnar wire reader, straight from bytes to ``view.DumpView``;
- ``view``: the compact in-memory view of one rank's dump that every reader produces;
- ``slot``: the ring slot layout (Python ring, C hot path and black box share it);
- ``blackbox`` and ``rawstacks``: the black-box file and the raw stacks beside it.

Nothing here imports the recorder, the readers or the analysis; nothing here needs torch.
"""
