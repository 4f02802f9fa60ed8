#!/usr/bin/python3
"""Writing the weights others load: deepspeed.cpp's torch.save and safetensors writers against
PyTorch's torch.save, same tensors, same run; then torch.load of each .bin file.

    /usr/bin/python3 bench/weights_export.py [--build build] [--n_layer 12 --n_embd 768]
                                             [--vocab 50304] [--dtypes fp32,bf16] [--reps 3]
                                             [--dir /dev/shm]

The state dict is a GPT's (the example GPT's names and shapes: wte, wpe, per block ln1, attn.qkv,
attn.proj, ln2, mlp.fc, mlp.proj, then ln_f and head). bench_weights_export writes it through the
library (atomically: a temporary file, fsync, rename, fsync of the folder) as pytorch_model.bin
(torch.save) and model.safetensors; this interpreter's torch.save writes the same shapes
(plain open + write, no fsync). Then each file is read back: by deepspeed::load_state_dict_file
(PyTorch's file too) and by torch.load(weights_only=True). Every row is the best of --reps after
one warm-up; the library's rows twice: under glibc's default malloc (this program) and under the
settings the library applies at initialize / init_inference. Last, PyTorch's file read once by
a fresh process, --reps processes each, the best: a program's first load, before anything it
freed can be reused (a warm process reuses freed memory, and Python's heap keeps more of it than
glibc gives a C++ program: the best-of rows above favour torch.load for that). --dir: where
the files go (/dev/shm by default: fsync costs nothing there, so the rows compare the writers'
CPU work; a disk folder adds the device). Prints a markdown table: bytes, seconds, GB/s.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The bench program is no entry point, so it runs under glibc's default malloc; a program after
# deepspeed::initialize / init_inference runs under the library's settings
# (src/util/host_allocator.h), given here through glibc's own variables.
MALLOC = {"": {},
          " (library's malloc settings)": {"MALLOC_MMAP_THRESHOLD_": str(32 << 20),
                                            "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}}


def gpt_shapes(n_layer, d, vocab, ctx):
    out = [["wte.weight", [vocab, d]], ["wpe.weight", [ctx, d]]]
    for i in range(n_layer):
        b = "block%d." % i
        out += [[b + "ln1.weight", [d]], [b + "ln1.bias", [d]],
                [b + "attn.qkv.weight", [3 * d, d]], [b + "attn.qkv.bias", [3 * d]],
                [b + "attn.proj.weight", [d, d]], [b + "attn.proj.bias", [d]],
                [b + "ln2.weight", [d]], [b + "ln2.bias", [d]],
                [b + "mlp.fc.weight", [4 * d, d]], [b + "mlp.fc.bias", [4 * d]],
                [b + "mlp.proj.weight", [d, 4 * d]], [b + "mlp.proj.bias", [d]]]
    out += [["ln_f.weight", [d]], ["ln_f.bias", [d]], ["head.weight", [vocab, d]]]
    return out


def best(reps, fn):
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


# A fresh process's first read of `path`, best of `reps` processes: the library's reader (glibc's
# default malloc: a program that has not called initialize) and torch.load (import not timed).
TORCH_LOAD_ONCE = ("import sys, time, torch\n"
                   "t = time.perf_counter()\n"
                   "torch.load(sys.argv[1], map_location='cpu', weights_only=True)\n"
                   "print(time.perf_counter() - t)\n")


def read_once_rows(exe, path, dtype_name, nbytes, reps):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    ours, theirs = [], []
    for _ in range(reps):
        out = subprocess.run([exe, "--read_once", path], check=True, env=env,
                             capture_output=True, text=True).stdout
        ours.append(json.loads(out.splitlines()[-1])["seconds"])
        out = subprocess.run([sys.executable, "-c", TORCH_LOAD_ONCE, path], check=True, env=env,
                             capture_output=True, text=True).stdout
        theirs.append(float(out.split()[-1]))
    return [(dtype_name, "read once, fresh process: deepspeed.cpp load_state_dict_file, "
             "PyTorch's file", "torch.save", nbytes, min(ours)),
            (dtype_name, "read once, fresh process: torch.load of PyTorch's file", "torch.save",
             nbytes, min(theirs))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--n_layer", type=int, default=12)
    ap.add_argument("--n_embd", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default="/dev/shm")
    a = ap.parse_args()
    exe = os.path.join(a.build, "bin", "bench_weights_export")
    if not os.path.exists(exe):
        sys.exit("weights_export.py: %s is not built (make build, or --build DIR)" % exe)
    torch.set_num_threads(1)
    shapes = gpt_shapes(a.n_layer, a.n_embd, a.vocab, a.ctx)
    params = sum(torch.Size(s).numel() for _, s in shapes)
    rows = []
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        for dtype_name in a.dtypes.split(","):
            if dtype_name not in ("fp32", "bf16"):
                sys.exit("weights_export.py: --dtypes: '%s' is not fp32 or bf16" % dtype_name)
            spec = os.path.join(tmp, "spec.json")
            with open(spec, "w") as f:
                json.dump({"dtype": dtype_name, "tensors": shapes}, f)
            dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
            torch.manual_seed(0)
            state = {n: torch.randn(s).to(dtype) for n, s in shapes}
            nbytes = sum(t.numel() * t.element_size() for t in state.values())
            theirs = os.path.join(tmp, "pytorch.bin")
            rows.append((dtype_name, "write: PyTorch " + torch.__version__ + " torch.save",
                         "torch.save", nbytes, best(a.reps, lambda: torch.save(state, theirs))))
            del state
            for malloc, extra in MALLOC.items():
                env = dict(os.environ, OMP_NUM_THREADS="1", **extra)
                out = subprocess.run([exe, spec, tmp, str(a.reps), theirs], check=True, env=env,
                                     capture_output=True, text=True).stdout
                for r in (json.loads(line) for line in out.splitlines() if line.startswith("{")):
                    whose = "PyTorch's" if r["path"] == theirs else "its own"
                    who = ("write: deepspeed.cpp" if r["op"] == "write" else
                           "read: deepspeed.cpp load_state_dict_file, " + whose + " file")
                    rows.append((dtype_name, who + malloc, r["format"], r["bytes"],
                                 r["seconds"]))
            for who, path in (("deepspeed.cpp's file", os.path.join(tmp, "dscpp.bin")),
                              ("PyTorch's file", theirs)):
                seconds = best(a.reps, lambda: torch.load(path, map_location="cpu",
                                                          weights_only=True))
                rows.append((dtype_name, "read: torch.load of " + who, "torch.save", nbytes,
                             seconds))
            rows += read_once_rows(exe, theirs, dtype_name, nbytes, a.reps)
    print("GPT state dict: %d layers, d %d, vocab %d: %.1fM parameters; files in %s; best of %d"
          % (a.n_layer, a.n_embd, a.vocab, params / 1e6, a.dir, a.reps))
    print()
    print("| dtype | writer / reader | format | MB | seconds | GB/s |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for dtype_name, who, fmt, nbytes, seconds in rows:
        print("| %s | %s | %s | %.0f | %.3f | %.2f |"
              % (dtype_name, who, fmt, nbytes / 1e6, seconds, nbytes / seconds / 1e9))


if __name__ == "__main__":
    main()
