"""PyTorch's own Flight Recorder, read in this process and merged into flightrec's dumps.

- ``harvest.py``: its ring, read at dump time;
- ``merge.py``: its entries lined up with flightrec's;
- ``watch.py``: the watchdog's view of collectives only PyTorch's recorder saw.
"""
