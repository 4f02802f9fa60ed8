#!/usr/bin/python3
"""Generation with deepspeed::init_inference (AutoTP) at tp 1, 2 and 4 against PyTorch, same weights.

    /usr/bin/python3 bench/tp_inference.py [--build build] [--n_layer 4 --n_embd 1024 --n_head 16]
                                          [--batch 1] [--prompt_len 32] [--new_tokens 64]
                                          [--tp 1,2,4] [--dtypes fp32,bf16] [--shm on,off]

Writes seeded weights of the example GPT to a safetensors file (bench_tp_inference
--write_weights), and for each dtype runs PyTorch (this interpreter's torch, one thread, its own
kv-cache loop over the same file, the weights cast to the dtype) and bench_tp_inference under
dsrun at each tp (one thread per rank, init_inference casting to the dtype), checks whether they
generate PyTorch's greedy tokens (all --new_tokens of every row), and prints a markdown table of first-token latency (the prompt's
forward) and decode tokens/s (best of --reps generations after a warm-up). --shm: for tp > 1, run
with the shared-memory all-reduce (on, the default for ranks on one host) and/or with Gloo's
(off: DS_SHM_ALLREDUCE=0), one row each, in the same run.
"""
import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    dtypes = {"F32": torch.float32, "BF16": torch.bfloat16, "I64": torch.int64}
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[b:end]), dtype=dtypes[e["dtype"]]).view(e["shape"])
    return out


class TorchGPT:
    """The example GPT (examples/gpt/model.cpp) in plain torch ops, with a kv-cache."""

    def __init__(self, w, n_layer, n_head):
        self.w, self.L, self.nh = w, n_layer, n_head
        self.C = w["wte.weight"].shape[1]

    def step(self, idx, cache, start):
        w, C, nh = self.w, self.C, self.nh
        B, T = idx.shape
        hd = C // nh
        x = w["wte.weight"][idx] + w["wpe.weight"][start:start + T]
        qpos = torch.arange(start, start + T).view(T, 1)
        for i in range(self.L):
            p = f"block{i}."
            h = F.layer_norm(x, (C,), w[p + "ln1.weight"], w[p + "ln1.bias"])
            q, k, v = F.linear(h, w[p + "attn.qkv.weight"], w[p + "attn.qkv.bias"]).split(C, 2)
            q, k, v = (t.view(B, T, nh, hd).transpose(1, 2) for t in (q, k, v))
            if i in cache:
                k, v = torch.cat([cache[i][0], k], 2), torch.cat([cache[i][1], v], 2)
            cache[i] = (k, v)
            att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
            att = att.masked_fill(torch.arange(k.shape[2]).view(1, -1) > qpos, float("-inf"))
            y = (att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
            x = x + F.linear(y, w[p + "attn.proj.weight"], w[p + "attn.proj.bias"])
            h = F.layer_norm(x, (C,), w[p + "ln2.weight"], w[p + "ln2.bias"])
            h = F.gelu(F.linear(h, w[p + "mlp.fc.weight"], w[p + "mlp.fc.bias"]))
            x = x + F.linear(h, w[p + "mlp.proj.weight"], w[p + "mlp.proj.bias"])
        x = F.layer_norm(x, (C,), w["ln_f.weight"], w["ln_f.bias"])
        return F.linear(x, w["head.weight"])


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def torch_run(weights, a, dtype):
    torch.set_num_threads(1)
    w = {k: (v.to(DTYPES[dtype]) if v.is_floating_point() else v) for k, v in read_safetensors(weights).items()}
    model = TorchGPT(w, a.n_layer, a.n_head)
    g = torch.Generator().manual_seed(7)
    prompt = torch.randint(256, (a.batch, a.prompt_len), generator=g)
    best_first, best_rate, tokens = 1e30, 0.0, []
    with torch.no_grad():
        for r in range(a.reps + 1):
            cache = {}
            t0 = time.perf_counter()
            nxt = model.step(prompt, cache, 0)[:, -1].argmax(-1).view(-1, 1)
            first = (time.perf_counter() - t0) * 1e3
            outs, pos = [nxt], a.prompt_len
            t1 = time.perf_counter()
            for i in range(1, a.new_tokens):
                nxt = model.step(nxt, cache, pos)[:, -1].argmax(-1).view(-1, 1)
                pos += 1
                outs.append(nxt)  # kept as tensors: no conversion inside the timed loop
            rate = a.batch * (a.new_tokens - 1) / (time.perf_counter() - t1)
            if r > 0:
                best_first, best_rate, tokens = min(best_first, first), max(best_rate, rate), outs
    return best_first, best_rate, token_text(torch.cat(tokens, 1).tolist())


def token_text(rows):
    """Every generated token of every row, as bench_tp_inference prints them: rows split by ';'."""
    return ";".join(",".join(map(str, row)) for row in rows)


def first_difference(ours, ref):
    """Where two token_text strings first differ: 'row r, token t: a vs b'."""
    a, b = [r.split(",") for r in ours.split(";")], [r.split(",") for r in ref.split(";")]
    if len(a) != len(b):
        return f"{len(a)} rows vs {len(b)}"
    for r, (x, y) in enumerate(zip(a, b)):
        for t in range(max(len(x), len(y))):
            u, v = (x[t] if t < len(x) else "none"), (y[t] if t < len(y) else "none")
            if u != v:
                return f"row {r}, token {t}: {u} vs {v}"
    return "equal"


def ds_run(build, weights, tp, dtype, model_flags, a, port, shm="on"):
    cmd = [os.path.join(build, "bin", "dsrun"), "--num_procs", str(tp), "--master_port", str(port),
           os.path.join(build, "bin", "bench_tp_inference"), "--weights", weights,
           "--tensor_parallel", str(tp), "--batch", str(a.batch), "--prompt_len", str(a.prompt_len),
           "--new_tokens", str(a.new_tokens), "--reps", str(a.reps), "--dtype", dtype] + model_flags
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_DEVICE="cpu", DS_COMM_BACKEND="gloo",
               DS_SHM_ALLREDUCE="1" if shm == "on" else "0")
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=1800)
    line = [l for l in out.stdout.splitlines() if "tp_inference " in l]
    if out.returncode != 0 or not line:
        sys.exit(f"failed ({out.returncode}): {' '.join(cmd)}\n{out.stdout[-3000:]}")
    kv = dict(x.split("=") for x in line[0].split("tp_inference ")[1].split())
    return float(kv["first_token_ms"]), float(kv["decode_tokens_per_s"]), kv["tokens"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--n_layer", type=int, default=4)
    p.add_argument("--n_embd", type=int, default=1024)
    p.add_argument("--n_head", type=int, default=16)
    p.add_argument("--block_size", type=int, default=256)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt_len", type=int, default=32)
    p.add_argument("--new_tokens", type=int, default=64)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--tp", default="1,2,4", help="tensor-parallel sizes, comma-separated")
    p.add_argument("--dtypes", default="fp32", help="fp32 and/or bf16, comma-separated")
    p.add_argument("--shm", default="on", help="tp > 1 all-reduce: on (shared memory) and/or off "
                   "(Gloo), comma-separated")
    a = p.parse_args()
    flags = ["--n_layer", str(a.n_layer), "--n_embd", str(a.n_embd), "--n_head", str(a.n_head),
             "--block_size", str(a.block_size)]
    with tempfile.TemporaryDirectory() as d:
        weights = os.path.join(d, "gpt.safetensors")
        subprocess.run([os.path.join(a.build, "bin", "bench_tp_inference"), "--write_weights", weights]
                       + flags, check=True, stdout=subprocess.DEVNULL)
        rows = []  # (dtype, name, first ms, tokens/s, tokens)
        for dtype in a.dtypes.split(","):
            rows.append((dtype, "PyTorch " + torch.__version__ + ", 1 process, 1 thread")
                        + torch_run(weights, a, dtype))
            for tp in map(int, a.tp.split(",")):
                for shm in (a.shm.split(",") if tp > 1 else ["on"]):
                    how = "" if tp == 1 else (", shm all-reduce" if shm == "on" else ", Gloo all-reduce")
                    rows.append((dtype, f"deepspeed.cpp init_inference, tp {tp} ({tp} x 1 thread{how})")
                                + ds_run(a.build, weights, tp, dtype, flags, a, 29900 + tp, shm))
    params = a.n_layer * 12 * a.n_embd ** 2 + 2 * 256 * a.n_embd + a.block_size * a.n_embd
    print(f"GPT n_layer {a.n_layer}, n_embd {a.n_embd}, n_head {a.n_head} (~{params / 1e6:.0f} M "
          f"parameters); batch {a.batch}, prompt {a.prompt_len}, {a.new_tokens} new tokens (greedy, "
          f"kv-cache), best of {a.reps}\n")
    print("| dtype | run | first token (ms) | decode tokens/s | vs PyTorch | same tokens as PyTorch |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    for dtype, name, first, rate, toks in rows:
        ref = next(r for r in rows if r[0] == dtype)
        # Every new token of every row (greedy: one early difference changes all that follow).
        same = "yes" if toks == ref[4] else "NO: " + first_difference(toks, ref[4])
        print(f"| {dtype} | {name} | {first:.1f} | {rate:.1f} | {rate / ref[3]:.2f}x | {same} |")


if __name__ == "__main__":
    main()
