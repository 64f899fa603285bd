"""What one process has recorded, in memory and in its black box.

- ``recorder.py``: ``Recorder``, the live state (ring, intern tables, group counters) and the
  slow paths the hot path calls on a cache miss, on async or GPU completion and on failure;
- ``tables.py`` (strings and tensor signatures) and ``stacks.py`` (raw Python stacks, captured
  on the hot path, symbolized at dump time): interning;
- ``completion.py``: completion of work the caller did not wait for;
- ``blackbox.py``: the ring and tables in a memory-mapped file a killed rank leaves behind.
"""
