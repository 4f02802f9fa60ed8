"""One rank of bench/gloo_exchange_schedules.sh: an all-to-all of KB per peer among HOSTS x
PER_HOST ranks (ranks 0..PER_HOST-1 on host 0, ...) moved in several message orders over
torch.distributed's Gloo (the same Gloo as libtorch 1.13's). Rank 0 prints one markdown row per
order: which one src/comm/gloo_exchange.cpp should post when several ranks share a host.

  python3 gloo_exchange_schedules.py RANK WORLD PER_HOST MASTER_ADDR PORT KB...
"""
import sys
import threading
import time

import torch
import torch.distributed as dist

rank, world, per_host = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
addr, port, sizes_kb = sys.argv[4], sys.argv[5], [float(s) for s in sys.argv[6:]]
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world)
host = rank // per_host


def peers(first_remote):
    """Peers in post_exchange's rotation (rank+1, rank+2, ...), remote-host peers first if asked."""
    ring = [(rank + i) % world for i in range(1, world)]
    if first_remote:
        ring.sort(key=lambda p: p // per_host == host)  # stable: remote ones keep their order
    return ring


def src_of(dst_order):
    """The receive order matching a send order: the i-th send of rank r goes to d, whose i-th
    receive must come from r; in the rotation that is rank - i."""
    return [(2 * rank - d) % world for d in dst_order]


def all_at_once(x, out, n, first_remote=False):  # gloo_exchange.cpp today (first_remote=False)
    works = [dist.irecv(out[p * n:(p + 1) * n], p) for p in src_of(peers(first_remote))]
    works += [dist.isend(x[p * n:(p + 1) * n], p) for p in peers(first_remote)]
    for w in works:
        w.wait()


def sends_one_at_a_time(x, out, n):
    recvs = [dist.irecv(out[p * n:(p + 1) * n], p) for p in src_of(peers(False))]
    for p in peers(False):
        dist.isend(x[p * n:(p + 1) * n], p).wait()
    for w in recvs:
        w.wait()


def stepwise(x, out, n):  # Gloo's alltoall order, the receive posted first in each step
    for i in range(1, world):
        dst, src = (rank + i) % world, (rank - i) % world
        r = dist.irecv(out[src * n:(src + 1) * n], src)
        s = dist.isend(x[dst * n:(dst + 1) * n], dst)
        s.wait()
        r.wait()


def timed(name, kb, f, reps=8):
    n = int(kb * 1e3 / 4)
    x, out = torch.randn(world * n), torch.empty(world * n)
    f(x, out, n)
    dist.barrier()
    best = float("inf")
    for _ in range(3):  # the best of three rounds of reps: other processes share the 2 cores
        start = time.perf_counter()
        for _ in range(reps):
            f(x, out, n)
        dist.barrier()
        best = min(best, (time.perf_counter() - start) / reps * 1e3)
    if rank == 0:
        print(f"| {name} | {kb:.0f} | {best:.1f} |", flush=True)


def in_flight(k, kb, serial_sends, reps=5):
    """k all-to-alls started at once (a prefetch queue): ms until the first and the last is done
    on every rank (the slowest rank's; the best of `reps`).
    serial_sends None: Gloo's alltoall; False: every exchange's messages posted at once; True:
    every receive posted at once, each exchange's sends only once the previous exchange's sends
    are done (one exchange at a time on the wire, as Gloo's worker runs its queue)."""
    n = int(kb * 1e3 / 4)
    xs = [torch.randn(world * n) for _ in range(k)]
    outs = [torch.empty(world * n) for _ in range(k)]
    first = last = float("inf")
    for rep in range(reps + 1):
        dist.barrier()
        start = time.perf_counter()
        if serial_sends is None:
            works = [[dist.all_to_all_single(o, x, async_op=True)] for x, o in zip(xs, outs)]
            sends = []
        else:
            # each exchange its own tag, as gloo_exchange.h's
            works = [[dist.irecv(o[p * n:(p + 1) * n], p, tag=e) for p in src_of(peers(False))]
                     for e, o in enumerate(outs)]
            sends = [[] for _ in range(k)]

            def post_sends():  # in a thread of its own when serial: the caller waits meanwhile
                for e, x in enumerate(xs):
                    sends[e] = [dist.isend(x[p * n:(p + 1) * n], p, tag=e) for p in peers(False)]
                    if serial_sends:
                        for w in sends[e]:
                            w.wait()
                        sends[e] = []  # a Gloo p2p work waited twice waits forever

            poster = threading.Thread(target=post_sends)
            poster.start()
            if not serial_sends:
                poster.join()
        for w in works[0]:
            w.wait()
        t_first = time.perf_counter() - start
        if serial_sends is not None:
            poster.join()
        for ws in works[1:]:  # a Gloo p2p work waited twice waits forever
            for w in ws:
                w.wait()
        for ss in sends:
            for w in ss:
                w.wait()
        t_last = time.perf_counter() - start
        slowest = torch.tensor([t_first, t_last], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # the group's, not rank 0's
        if rep > 0:  # the first is warm-up
            first, last = min(first, slowest[0].item()), min(last, slowest[1].item())
    if rank == 0:
        name = {None: "Gloo's alltoall", False: "messages, all posted at once",
                True: "messages, sends one exchange at a time"}[serial_sends]
        print(f"| {k} in flight: {name} | {kb:.0f} | {first * 1e3:.1f} | {last * 1e3:.1f} |",
              flush=True)


if rank == 0:
    print(f"{world // per_host} hosts x {per_host} ranks")
    print("| all-to-all moved as | KB per peer | ms |")
    print("|---|---:|---:|")
for kb in sizes_kb:
    timed("Gloo's alltoall", kb, lambda x, out, n: dist.all_to_all_single(out, x))
    timed("all receives, then all sends (rotation)", kb, all_at_once)
    timed("all receives, then all sends (remote peers first)", kb,
          lambda x, out, n: all_at_once(x, out, n, True))
    timed("all receives, then one send at a time", kb, sends_one_at_a_time)
    timed("stepwise: receive, send, wait both", kb, stepwise)
if rank == 0:
    print("| all-to-alls started together | KB per peer | ms to the first done | ms to all |")
    print("|---|---:|---:|---:|")
for kb in sizes_kb:
    for serial in (None, False, True):
        in_flight(4, kb, serial)
