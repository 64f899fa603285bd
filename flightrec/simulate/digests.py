"""The in-job slow check's digests of a simulated job, check after check.

A job whose timing is played out (``SimConfig.played``, or a slow fault) is sampled at
``checks`` instants spread over its history: at each, every rank's digest holds what its ring
would (``exchange.slowcheck.make_digest`` builds the same from a real ring): per group its
newest completed collectives, and its own time and P2P peers over its newest entries. Fed
to ``flightrec.live.slow.SlowJudge`` one check at a time, they test and benchmark the live
judgment of slow workers, slow stages and spread imbalance on pipelines of any size.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from flightrec.format import flightrec_pb2 as pb
from flightrec.format.activity import ring_activity, signature
from flightrec.format.digest import MAX_GROUPS, MAX_PER_GROUP, Digest, GroupDigest, encode
from flightrec.simulate.faults import op_keys
from flightrec.simulate.job import EPOCH_NS, SimConfig, plan

RING = 2000
"""Entries of each rank's ring the digest is made from."""


def checked_digests(config: SimConfig, checks: int) -> Iterator[dict[int, bytes]]:
    """Every rank's digest at each of ``checks`` instants over the job's history.

    Args:
        config: the job (its timing is played out whatever ``played`` says).
        checks: how many checks, evenly spread after the first quarter of the history.

    Yields:
        Per check, each rank's encoded digest (what rank 0 gathers from the store).
    """
    p = plan(replace(config, played=True))
    played = p.played
    assert played is not None  # (plan plays every job asked to)
    layout = config.layout
    n = layout.world
    per_stage = [op_keys(t) for t in p.templates]
    ops = [{op.op for op in t} for t in p.templates]
    names = sorted({o for s in ops for o in s})
    start, end = played.complete[0][0], played.end_ns
    for c in range(checks):
        at = start + (end - start) * (c + 1 + checks // 3) // (checks + checks // 3)
        out: dict[int, bytes] = {}
        for r in range(n):
            stage = layout.coords(r)[1]
            program, keys = p.templates[stage], per_stage[stage]
            groups = layout.groups_of(r)
            gindex = {g.kind: i for i, g in enumerate(groups)}
            enq, comp = played.enqueue[r], played.complete[r]
            done = sum(1 for t in comp if t and t <= at)
            first = max(0, done - RING)
            step_ops = len(program)
            per_step = {kind: 0 for kind, *_ in keys}
            for kind, _, delta, _ in keys:
                per_step[kind] += 0 if delta else 1
            rows: dict[int, list[tuple[int, int, int]]] = {}
            flags, sig, peers = [], [], []
            for i in range(first, done):
                step, k = divmod(i, step_ops)
                kind, ordinal, delta, send = keys[k]
                g = gindex[kind]
                f = (pb.IS_P2P | (pb.SEND if send else 0)) if delta else 0
                peer = r + delta * layout.tp if delta else -1
                flags.append(f)
                peers.append(peer)
                sig.append(signature(names.index(program[k].op), g, f, peer))
                if not delta:
                    seq = step * per_step[kind] + ordinal + 1
                    rows.setdefault(g, []).append((seq, enq[i] + EPOCH_NS, comp[i] + EPOCH_NS))
            made = [
                GroupDigest(
                    groups[g].name,
                    len(groups[g].ranks),
                    *(tuple(x[j] for x in kept) for j in range(3)),
                )
                for g, got in rows.items()
                if len(groups[g].ranks) > 1 and (kept := got[-MAX_PER_GROUP:])
            ]
            made.sort(key=lambda gd: -gd.complete_ns[-1])
            activity = ring_activity(enq[first:done], comp[first:done], flags, sig, peers)
            host, device = f"node{layout.host(r):05d}", f"cuda:{r % layout.ranks_per_host}"
            d = Digest(r, n, at + EPOCH_NS, host, device, tuple(made[:MAX_GROUPS]), activity)
            out[r] = encode(d)
        yield out
