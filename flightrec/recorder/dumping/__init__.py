"""Dumps: what leaves the process when a hang, an error, a signal, the exit or a request says so.

- ``dumper.py``: copy the recorder's state under a short lock, build and write the dump outside;
- ``exceptions.py``: the exception a rank dies of, recorded on its way out;
- ``rawstacks.py``: raw Python stacks (faulthandler) for when no Python code can run;
- ``upload.py``: dumps to object storage.
"""
