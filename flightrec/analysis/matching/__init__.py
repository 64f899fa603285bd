"""Matching: line ranks' histories up per process group by sequence number (P2P by peer pair),
and what two ranks issuing the same collective must agree on."""
