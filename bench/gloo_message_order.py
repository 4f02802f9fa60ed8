"""One rank of bench/gloo_message_order.sh: what Gloo's collectives and point-to-point messages
cost between two hosts, with the receive posted before or after the send (torch.distributed
over Gloo, the same Gloo as libtorch 1.13's). Rank 0 prints one markdown row per case.

  python3 gloo_message_order.py RANK MASTER_ADDR PORT MEGABYTES
"""
import sys
import time

import torch
import torch.distributed as dist

rank, addr, port, mb = int(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4])
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=2)
peer = 1 - rank
n = int(mb * 1e6 / 4)  # fp32 elements each direction
x, out = torch.randn(2 * n), torch.empty(2 * n)


def timed(name, each_way_mb, f, reps=5):
    f()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(reps):
        f()
    dist.barrier()
    ms = (time.perf_counter() - start) / reps * 1e3
    if rank == 0:
        print(f"| {name} | {each_way_mb:.1f} | {ms:.1f} |", flush=True)


def one_way():
    if rank == 0:
        dist.send(x[:n], 1)
    else:
        dist.recv(out[:n], 0)


def send_then_recv():
    s = dist.isend(x[:n], peer)
    r = dist.irecv(out[:n], peer)
    s.wait()
    r.wait()


def recv_then_send():
    r = dist.irecv(out[:n], peer)
    s = dist.isend(x[:n], peer)
    s.wait()
    r.wait()


def two_broadcasts():  # our all_gather before the exchange: one broadcast per rank
    works = [dist.broadcast(x[:n], 0, async_op=True), dist.broadcast(x[n:], 1, async_op=True)]
    for w in works:
        w.wait()


if rank == 0:
    print("| messages | MB each way | ms |")
    print("|---|---:|---:|")
timed("one way only (rank 0 -> 1)", mb, one_way)
timed("both ways, send posted first", mb, send_then_recv)
timed("both ways, receive posted first", mb, recv_then_send)
timed("alltoall (Gloo's)", mb, lambda: dist.all_to_all_single(out, x))
timed("2 broadcasts, one from each rank", mb, two_broadcasts)
timed("all_reduce (Gloo's ring)", 2 * mb, lambda: dist.all_reduce(x))
