#!/usr/bin/python3
"""PyTorch DDP (Gloo, CPU) on the same GPT, data and optimizer as examples/gpt/gpt_train.

Run by bench/zero_memory_and_speed.py; prints one `gpt_train_report ...` line per rank, in the same
format as gpt_train, so both land in one table.

Same model: byte-level GPT, pre-LayerNorm blocks (causal self-attention, GELU MLP), N(0, 0.02)
init (--scaled_residual_init: GPT-2's 0.02 / sqrt(2 * n_layer) for the attention and MLP output
projections, as gpt_train's flag of that name). Same data: windows of block_size bytes every
block_size/2 bytes of --data, in the order of deepspeed.cpp's DistributedSampler (mt19937_64
Fisher-Yates, the config's "seed", default 1234), the last micro-batch of an epoch partial unless
the config sets dataloader_drop_last (deepspeed.cpp's loader). Same optimizer: AdamW (betas, eps,
weight decay from the ds_config), DeepSpeed's WarmupLR, the config's gradient_clipping.
tests/tools/ddp_baseline_tie.sh checks that both train the same model: the same losses step by
step (--exact_loss prints them as gpt_train's flag of that name does).

DDP runs with its defaults unless told otherwise, as the published rows of docs/benchmarks.md
were measured: broadcast_buffers=True (rank 0's buffers, here the causal masks, broadcast before
every forward) and gradient_as_bucket_view=False (the gradients are a second fp32 copy of the
reducer's buckets: +4 bytes per parameter in peak memory). --no_broadcast_buffers and
--gradient_as_bucket_view run the lean DDP.
"""
import argparse
import json
import math
import os
import resource
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, h, t):  # gpt_train's names: fc_proj is its mlp.proj
        super().__init__()
        self.n_head = h
        self.ln1 = nn.LayerNorm(c)
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)
        self.ln2 = nn.LayerNorm(c)
        self.fc = nn.Linear(c, 4 * c)
        self.fc_proj = nn.Linear(4 * c, c)
        self.register_buffer("mask", torch.ones(t, t).tril())

    def attn(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (z.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.n_head))
        att = att.masked_fill(self.mask[:T, :T] == 0, float("-inf")).softmax(-1)
        return self.proj((att @ v).transpose(1, 2).contiguous().view(B, T, C))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, block_size, vocab=256, scaled_residual_init=False):
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList([Block(n_embd, n_head, block_size) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab, bias=False)
        # In module order, as gpt::gpt2_init draws them (the same values from the same seed).
        residual = {b.proj for b in self.blocks} | {b.fc_proj for b in self.blocks}
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                std = 0.02 / math.sqrt(2 * n_layer) if scaled_residual_init and m in residual else 0.02
                nn.init.normal_(m.weight, 0.0, std)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


class MT64:
    """std::mt19937_64, so the sample order equals deepspeed.cpp's DistributedSampler."""

    def __init__(self, seed):
        self.mt = [0] * 312
        self.i = 312
        self.mt[0] = seed & (2**64 - 1)
        for i in range(1, 312):
            prev = self.mt[i - 1]
            self.mt[i] = (6364136223846793005 * (prev ^ (prev >> 62)) + i) & (2**64 - 1)

    def __call__(self):
        if self.i >= 312:
            for i in range(312):
                x = (self.mt[i] & 0xFFFFFFFF80000000) | (self.mt[(i + 1) % 312] & 0x7FFFFFFF)
                xa = x >> 1
                if x & 1:
                    xa ^= 0xB5026F5AA96619E9
                self.mt[i] = self.mt[(i + 156) % 312] ^ xa
            self.i = 0
        y = self.mt[self.i]
        self.i += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        y ^= y >> 43
        return y & (2**64 - 1)


def rank_indices(n, rank, world, seed, epoch):
    order = list(range(n))
    gen = MT64(seed + epoch)
    for i in range(n - 1, 0, -1):
        j = gen() % (i + 1)
        order[i], order[j] = order[j], order[i]
    per_rank = (n + world - 1) // world
    order += order[: per_rank * world - n]
    return order[rank::world]


def batches(data, block, stride, micro, rank, world, seed, drop_last):
    n = (len(data) - block - 1) // stride + 1
    epoch = 0
    while True:
        mine = rank_indices(n, rank, world, seed, epoch)
        # deepspeed.cpp's DataLoader: the shard's last micro-batch may be partial (smaller)
        # unless dataloader_drop_last.
        count = len(mine) // micro if drop_last else (len(mine) + micro - 1) // micro
        for b in range(count):
            idx = mine[b * micro:(b + 1) * micro]
            w = torch.stack([torch.tensor(list(data[i * stride:i * stride + block + 1])) for i in idx])
            yield w[:, :-1], w[:, 1:]
        epoch += 1


def tensor_bytes(tensors):
    # Each storage once: with gradient_as_bucket_view every .grad is a view into its DDP bucket,
    # and counting the bucket once per view read 2 GB for a 77 MB gradient.
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        storage = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
        if storage.data_ptr() in seen:
            continue
        seen.add(storage.data_ptr())
        total += storage.nbytes()
    return total


def worker(args):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    cfg = json.load(open(args.config))
    opt_params = cfg["optimizer"]["params"]
    scheduler = cfg.get("scheduler")
    if scheduler is not None and scheduler.get("type") != "WarmupLR":
        sys.exit(f"ddp_baseline.py: scheduler.type {scheduler.get('type')!r}: only WarmupLR is reproduced")
    sched = (scheduler or {}).get("params", {})
    torch.manual_seed(args.seed)
    model = GPT(args.n_layer, args.n_head, args.n_embd, args.block_size,
                scaled_residual_init=args.scaled_residual_init)
    ddp = nn.parallel.DistributedDataParallel(model, broadcast_buffers=args.broadcast_buffers,
                                              gradient_as_bucket_view=args.gradient_as_bucket_view)
    opt = torch.optim.AdamW(model.parameters(), lr=opt_params["lr"], betas=tuple(opt_params.get("betas", (0.9, 0.999))),
                            eps=opt_params.get("eps", 1e-8), weight_decay=opt_params.get("weight_decay", 0.0))
    lr_max, lr_min = sched.get("warmup_max_lr", opt_params["lr"]), sched.get("warmup_min_lr", 0.0)
    # DeepSpeed's WarmupLR (and deepspeed.cpp's): at least 2 warm-up steps, 1000 unless given,
    # log warm-up unless "linear"; no scheduler block: the optimizer's lr throughout.
    warm = max(2, sched.get("warmup_num_steps", 1000))
    log_warmup = sched.get("warmup_type", "log") == "log"

    def lr_at(t):  # t = last_batch_iteration: -1 before the first step (WarmupLR writes min_lr)
        if scheduler is None:
            return opt_params["lr"]
        if t < 0:
            return lr_min
        if t >= warm:
            return lr_max
        gamma = math.log(t + 1) / math.log(warm) if log_warmup else t / warm
        return lr_min + (lr_max - lr_min) * max(gamma, 0.0)

    data = open(args.data, "rb").read()
    stream = batches(data, args.block_size, args.block_size // 2, cfg["train_micro_batch_size_per_gpu"], rank, world,
                     cfg.get("seed", 1234), cfg.get("dataloader_drop_last", False))
    t = -1
    for g in opt.param_groups:
        g["lr"] = lr_at(t)
    losses, timed_from = [], None
    for step in range(1, args.steps + 1):
        x, y = next(stream)
        if args.autocast_bf16:  # PyTorch's own mixed precision: fp32 weights, bf16 compute
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = ddp(x, y)
        else:
            loss = ddp(x, y)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        if cfg.get("gradient_clipping", 0) > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["gradient_clipping"])
        opt.step()
        t += 1
        for g in opt.param_groups:
            g["lr"] = lr_at(t)
        l = loss.detach().clone()
        dist.all_reduce(l)
        losses.append(l.item() / world)
        if args.exact_loss and rank == 0:
            print(f"step {step} loss {losses[-1]:.4f} exact {losses[-1].hex()}", flush=True)
        if step == 1:
            timed_from = time.time()
    seconds = time.time() - timed_from
    timed = max(1, args.steps - 1)
    tokens = timed * cfg["train_micro_batch_size_per_gpu"] * world * args.block_size
    params = tensor_bytes(model.parameters())
    grads = tensor_bytes(p.grad for p in model.parameters())
    optim = tensor_bytes(v for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0)
    print(f"gpt_train_report rank={rank} step_ms={1e3 * seconds / timed:.2f} tokens_per_s={tokens / seconds:.1f} "
          f"final_loss={losses[-1]:.5f} params_bytes={params} grads_bytes={grads} optim_bytes={optim} comm_bytes=0 "
          f"model_state_bytes={params + grads + optim} peak_rss_kb={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss} "
          f"num_params={sum(p.numel() for p in model.parameters())}", flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--n_layer", type=int, default=4)
    p.add_argument("--n_head", type=int, default=4)
    p.add_argument("--n_embd", type=int, default=256)
    p.add_argument("--block_size", type=int, default=128)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--autocast_bf16", action="store_true")
    p.add_argument("--scaled_residual_init", action="store_true",
                   help="GPT-2's std 0.02 / sqrt(2 * n_layer) for the attention and MLP output projections")
    p.add_argument("--exact_loss", action="store_true", help="print each step's loss (rank 0), also as a hex float")
    # DDP's defaults (the published rows); see the docstring for what they cost.
    p.add_argument("--broadcast_buffers", dest="broadcast_buffers", action="store_true", default=True,
                   help="DDP broadcasts rank 0's buffers before every forward (DDP's default)")
    p.add_argument("--no_broadcast_buffers", dest="broadcast_buffers", action="store_false",
                   help="no buffer broadcast (the causal masks are equal on every rank)")
    p.add_argument("--gradient_as_bucket_view", action="store_true",
                   help="gradients are views into DDP's buckets (no second fp32 copy; default off, DDP's default)")
    p.add_argument("--local_rank", type=int, default=0)  # appended by dsrun
    worker(p.parse_args())


if __name__ == "__main__":
    main()
