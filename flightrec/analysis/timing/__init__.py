"""Timing: every rank's clock aligned onto one, and who arrived last at each collective
(``lastarrivals``, with its C twin ``_arrivals.c``)."""
