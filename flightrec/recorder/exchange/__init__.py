"""The live exchange: ranks talking to each other through the job's rendezvous store.

- ``store.py``: the store connection and dump requests (one rank asks, every rank dumps);
- ``endpoint.py``: where ``flightrec trigger`` finds a running job's store;
- ``trigger.py``: ``flightrec trigger``'s half;
- ``verdict.py``: the recorder's half of the verdict in the job's log (summaries published,
  one reporter picked);
- ``slowcheck.py``: the in-job slow check (each rank's digest, judged on rank 0).
"""
