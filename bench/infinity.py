#!/usr/bin/python3
"""ZeRO-Infinity: train a GPT whose model states do not fit in RAM, with parameters and optimizer
states offloaded to NVMe, and measure what it costs.

    /usr/bin/python3 bench/infinity.py [--build build] [--procs 2] [--steps 4]
                                       [--scale full|small] [--n_layer L] [--n_embd E]
                                       [--n_head H] [--block_size T] [--micro_batch B] [--lr LR]
                                       [--nvme_dir DIR] [--no_param_offload]
                                       [--disk_test_gib G] [--set KEY.PATH=JSON ...] [--dry_run]
                                       [--compare | --compare_states]

--scale full (the default) sizes the example GPT (n_embd 4096, n_head 32, block 64) with the
smallest n_layer whose model states, 16 bytes per parameter (bf16 weights and gradients, fp32
master and two Adam moments), are at least 1.5x this machine's RAM (MemTotal). It trains it on
--procs ranks (one thread each) with ZeRO stage 3, bf16, offload_param and offload_optimizer both
on "nvme" in a fresh folder under --nvme_dir (default /var/tmp: the real disk, never a tmpfs), for
--steps steps. --scale small is a quick check (n_layer 2, n_embd 256, 3 steps, a 1 GiB disk test);
--no_param_offload keeps the parameters in RAM (only the optimizer states go to disk).
--compare trains one model that fits in RAM in memory and with each NVMe path; --compare_states
trains it with parameters and optimizer on NVMe in each optimizer-state format: fp32 masters and
moments, bf16 masters (bf16.bf16_master_weights_and_grads) with fp32 moments, and bf16 masters
and moments (+ bf16.bf16_optimizer_states).

In the same run, on the same folder, it first measures the disk's sequential throughput: one file
(min(--disk_test_gib, 10% of the free space)) written with O_DIRECT in 8 MiB requests and fsync'd,
then read back with O_DIRECT, then deleted. While the job runs it samples every 0.5 s the summed
VmRSS of the ranks (the launcher's children), their /proc/<pid>/io counters and the bytes
allocated under the swap folder. The job's exact disk bytes come from this script's own
/proc/self/io: the kernel adds a reaped child's counters (and those of the children it reaped) to
its parent's. The ranks run with MALLOC_MMAP_THRESHOLD_=65536 (freed blocks go back to the OS, so
RSS shows what is needed; --plain_malloc turns this off).

Prints a markdown table (parameters, model-state bytes against RAM, state bytes on disk, peak RSS,
step time, disk throughput of the job against the disk's own), a per-step table and a verdict:
model states >= 1.5x RAM, peak RSS < 50% of RAM, loss falling. Exit status: 1 if the job failed
or the loss did not fall; 3 if, at --scale full, the memory goals were missed; else 0. The folder
under --nvme_dir is removed at the end, also on failure or interrupt.
"""
import argparse
import json
import math
import mmap
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = 256
CHUNK = 8 << 20               # disk test request size
STATE_BYTES_PER_PARAM = 16    # bf16 weight + bf16 gradient + fp32 master, exp_avg, exp_avg_sq
GOAL_RATIO, GOAL_RSS = 1.5, 0.5
SCALES = {  # n_layer None: the smallest that reaches GOAL_RATIO x RAM
    "full": dict(n_layer=None, n_embd=4096, n_head=32, block_size=64, steps=4, micro_batch=2, disk_test_gib=4.0),
    "small": dict(n_layer=2, n_embd=256, n_head=4, block_size=64, steps=3, micro_batch=4, disk_test_gib=1.0),
}
STEP_LINE = re.compile(r"^\[rank 0\] step (\d+) loss (\S+)")


def meminfo_bytes(key):
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    sys.exit(f"no {key} in /proc/meminfo")


def block_params(e):
    # qkv 3e^2+3e, attention proj e^2+e, fc 4e^2+4e, MLP proj 4e^2+e, two LayerNorms 4e
    return 12 * e * e + 13 * e


def gpt_params(n_layer, e, t):
    # + token and position embeddings, final LayerNorm, head (no bias, not tied)
    return n_layer * block_params(e) + VOCAB * e + t * e + 2 * e + VOCAB * e


def layers_for(ram, e, t):
    target = GOAL_RATIO * ram / STATE_BYTES_PER_PARAM
    return max(1, math.ceil((target - gpt_params(0, e, t)) / block_params(e)))


def fs_type(path):
    """File system type of the mount holding path (longest mount-point prefix in /proc/mounts)."""
    path, best, kind = os.path.realpath(path), "", "?"
    with open("/proc/mounts") as f:
        for line in f:
            mnt, typ = line.split()[1:3]
            mnt = mnt.replace("\\040", " ")
            if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                best, kind = mnt, typ
    return kind


def disk_speed(folder, size):
    """Sequential write (+ fsync) and read of one `size`-byte file in CHUNK requests, O_DIRECT where
    the file system allows it. Returns (write B/s, read B/s, direct)."""
    path = os.path.join(folder, "sequential_test.bin")
    buf = mmap.mmap(-1, CHUNK)  # page-aligned, as O_DIRECT requires
    buf.write(os.urandom(CHUNK))
    n = max(1, size // CHUNK)
    direct = True
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o600)
    except OSError:
        direct = False
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        start = time.monotonic()
        for i in range(n):
            buf[:8] = i.to_bytes(8, "little")  # no two chunks alike
            if os.write(fd, buf) != CHUNK:
                sys.exit(f"short write to {path}")
        os.fsync(fd)
        write_bps = n * CHUNK / (time.monotonic() - start)
        os.close(fd)
        fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
        if not direct:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        start, got = time.monotonic(), 0
        while (k := os.readv(fd, [buf])) > 0:
            got += k
        read_bps = got / (time.monotonic() - start)
    finally:
        os.close(fd)
        os.unlink(path)
    return write_bps, read_bps, direct


def proc_io(pid):
    """(read_bytes, write_bytes - cancelled_write_bytes) of a process, its reaped children included."""
    v = {}
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            k, _, n = line.partition(":")
            v[k] = int(n)
    return v["read_bytes"], v["write_bytes"] - v["cancelled_write_bytes"]


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:  # kernel without CONFIG_PROC_CHILDREN: scan every process's parent
        found = []
        for d in os.listdir("/proc"):
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(d))
            except (OSError, ValueError, IndexError):
                pass
        return found


def vm_rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def allocated_bytes(folder):
    total = 0
    for d, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(d, name)).st_blocks * 512
            except OSError:  # removed under us
                pass
    return total


class JobWatch:
    """Samples the ranks (the launcher's children) every `period` s from a thread: the peak of
    their summed VmRSS, their cumulative disk I/O and the peak bytes allocated in each swap folder.
    sample() may also be called from the reading thread (at each step line)."""

    def __init__(self, launcher_pid, swap_dirs, period=0.5):
        self.launcher, self.swap_dirs, self.period = launcher_pid, swap_dirs, period
        self.lock = threading.Lock()
        self.io = {}  # pid -> (read, written): the last values seen (they vanish with the rank)
        self.rss_peak = 0
        self.disk_peak = {d: 0 for d in swap_dirs}
        self.disk_peak_total = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self):
        while not self.stop.wait(self.period):
            self.sample()

    def sample(self):
        """Takes one sample; returns the ranks' (read, written) bytes so far."""
        with self.lock:
            rss = 0
            for pid in children(self.launcher):
                try:
                    rss += vm_rss(pid)
                    old, new = self.io.get(pid, (0, 0)), proc_io(pid)  # an exiting rank may read 0
                    self.io[pid] = (max(old[0], new[0]), max(old[1], new[1]))
                except (OSError, KeyError):  # exited between listing and reading
                    pass
            self.rss_peak = max(self.rss_peak, rss)
            sizes = {d: allocated_bytes(d) for d in self.swap_dirs}
            for d, n in sizes.items():
                self.disk_peak[d] = max(self.disk_peak[d], n)
            self.disk_peak_total = max(self.disk_peak_total, sum(sizes.values()))
            return sum(r for r, _ in self.io.values()), sum(w for _, w in self.io.values())

    def close(self):
        self.stop.set()
        self.thread.join()


def set_key(cfg, assignment):
    """--set a.b.c=VALUE: VALUE as JSON if it parses, else as a string."""
    path, sep, value = assignment.partition("=")
    if not sep:
        sys.exit(f"--set {assignment}: expected KEY.PATH=VALUE")
    try:
        value = json.loads(value)
    except ValueError:
        pass
    *parents, last = path.split(".")
    for k in parents:
        cfg = cfg.setdefault(k, {})
    cfg[last] = value


def make_config(a, params, swap, extra=()):
    """The DeepSpeed config: stage 3, bf16, NVMe offload; working set bounded to about two blocks."""
    block = block_params(a.n_embd)
    partition = math.ceil(params / a.procs)
    zero = {
        "stage": 3,
        # SwappedAdam keeps buffer_count sub-groups of 12 B/element in RAM: about 0.25 GB per rank here.
        "sub_group_size": min(5_000_000, math.ceil(partition / 4)),
        "reduce_bucket_size": min(25_000_000, block),
        "stage3_max_live_parameters": 2 * block + 1024,
        "stage3_prefetch_bucket_size": block + 1024,
        "stage3_max_reuse_distance": 0,
    }
    if "optimizer" in swap:
        zero["offload_optimizer"] = {"device": "nvme", "nvme_path": swap["optimizer"], "buffer_count": 4}
    if "param" in swap:
        zero["offload_param"] = {
            "device": "nvme", "nvme_path": swap["param"],
            # a buffer holds one rank's slice of one unit (a block, padded); two are read ahead
            "buffer_count": 2, "buffer_size": math.ceil(block / a.procs) + 1_000_000,
            "max_in_cpu": 0,  # every block's slice on disk (DeepSpeed's 1e9 would keep most in RAM)
        }
    cfg = {
        "train_micro_batch_size_per_gpu": a.micro_batch,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 0,
        "optimizer": {"type": "AdamW",
                      "params": {"lr": a.lr, "betas": [0.9, 0.99], "eps": 1e-8, "weight_decay": 0.01}},
        "gradient_clipping": 1.0,
        "bf16": {"enabled": True},
        "zero_optimization": zero,
        "aio": {"block_size": 1 << 20, "queue_depth": 8},
        "seed": 1234,
    }
    for s in list(a.set) + list(extra):
        set_key(cfg, s)
    return cfg


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Job:
    """One dsrun job, its output read line by line as it arrives (echoed to stderr)."""

    def __init__(self, cmd, env, swap_dirs, timeout_s):
        self.io_before = proc_io("self")
        self.start = time.monotonic()
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, bufsize=1)
        self.watch = JobWatch(self.proc.pid, swap_dirs)
        self.timed_out = False
        self.timer = threading.Timer(timeout_s, self._time_out)
        self.timer.start()
        self.steps = []  # (step, loss, seconds since start, ranks' bytes read, written)
        self.reports = []
        self.tail = []

    def _time_out(self):
        self.timed_out = True
        self.proc.terminate()

    def run(self):
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            now = time.monotonic() - self.start
            print(f"  [{now:7.1f} s] {line}", file=sys.stderr, flush=True)
            self.tail = (self.tail + [line])[-40:]
            m = STEP_LINE.match(line)
            if m:
                self.steps.append((int(m.group(1)), float(m.group(2)), now) + self.watch.sample())
            if "gpt_train_report " in line:
                self.reports.append(dict(kv.split("=", 1) for kv in line.split("gpt_train_report ")[1].split()))
        self.returncode = self.proc.wait()
        self.seconds = time.monotonic() - self.start
        self.timer.cancel()
        self.watch.close()
        before, after = self.io_before, proc_io("self")
        self.read_bytes, self.written_bytes = after[0] - before[0], after[1] - before[1]
        return self

    def stop(self):
        """Ends the job if it still runs (dsrun forwards SIGTERM to the ranks)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.timer.cancel()
        self.watch.stop.set()


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--scale", choices=SCALES, default="full")
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--steps", type=int)
    p.add_argument("--n_layer", type=int, help="default: the smallest reaching 1.5x RAM (full scale)")
    p.add_argument("--n_embd", type=int)
    p.add_argument("--n_head", type=int)
    p.add_argument("--block_size", type=int)
    p.add_argument("--micro_batch", type=int)
    p.add_argument("--lr", type=float, help="default 0.04 / n_embd (1e-5 at 4096)")
    p.add_argument("--nvme_dir", default="/var/tmp", help="a fresh folder is made (and removed) in it")
    p.add_argument("--no_param_offload", action="store_true", help="only the optimizer states go to NVMe")
    p.add_argument("--disk_test_gib", type=float, help="size of the sequential disk test (0: skip)")
    p.add_argument("--plain_malloc", action="store_true", help="do not set MALLOC_MMAP_THRESHOLD_")
    p.add_argument("--dry_run", action="store_true", help="print the plan and the config; run nothing")
    p.add_argument("--compare", action="store_true",
                   help="same model three times: in memory, optimizer on NVMe, both on NVMe "
                        "(default model n_layer 2: it must fit in RAM)")
    p.add_argument("--compare_states", action="store_true",
                   help="same model, parameters and optimizer on NVMe, in each optimizer-state "
                        "format (fp32; bf16 masters; bf16 masters and moments)")
    p.add_argument("--timeout_min", type=float, default=180)
    p.add_argument("--set", action="append", default=[], metavar="KEY.PATH=JSON",
                   help="override a config key, e.g. zero_optimization.sub_group_size=1e7")
    a = p.parse_args()
    for k, v in SCALES[a.scale].items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.lr is None:
        # Adam's first steps move every weight by about lr: a layer's output then moves by about
        # lr * n_embd, kept near 0.04 so the few steps of the run descend instead of diverging.
        a.lr = 0.04 / a.n_embd
    return a


def check_folder(a, params):
    """Exits unless --nvme_dir is on a real disk with room for the swapped states."""
    if not os.path.isdir(a.nvme_dir):
        sys.exit(f"--nvme_dir {a.nvme_dir} is not a directory")
    kind = fs_type(a.nvme_dir)
    if kind in ("tmpfs", "ramfs"):
        sys.exit(f"--nvme_dir {a.nvme_dir} is on {kind} (RAM): give a folder on a disk")
    per_param = 12 if a.no_param_offload else 14  # fp32 master + 2 moments (+ bf16 weights)
    need = int(per_param * params * 1.15) + (2 << 30)
    free = shutil.disk_usage(a.nvme_dir).free
    if free < need:
        sys.exit(f"--nvme_dir {a.nvme_dir}: {free / 1e9:.1f} GB free, the job needs about "
                 f"{need / 1e9:.1f} GB ({per_param} B/parameter x {params / 1e9:.2f}B parameters + 15% + 2 GiB)")
    return kind, free


def mb(n):
    return f"{n / 1e6:,.1f} MB" if n < 1e8 else f"{n / 1e6:,.0f} MB"


def gb(n):
    return f"{n / 1e9:,.2f} GB" if n >= 1e9 else mb(n)


def summarize(a, ram, params, job, disk, fs):
    """Prints the tables and the verdict; returns the exit status."""
    reports = job.reports
    if job.returncode != 0 or len(reports) != a.procs or not job.steps:
        why = "timed out (--timeout_min)" if job.timed_out else f"exit status {job.returncode}"
        print(f"\njob failed ({why}, {len(reports)}/{a.procs} reports, "
              f"{len(job.steps)} step lines):\n" + "\n".join(job.tail), file=sys.stderr)
        return 1
    num_params = int(reports[0]["num_params"])
    if num_params != params:
        print(f"note: gpt_train counts {num_params} parameters, the formula {params}", file=sys.stderr)
    states = STATE_BYTES_PER_PARAM * num_params
    hwm_sum = sum(int(r["peak_rss_kb"]) * 1024 for r in reports)
    rss = max(hwm_sum, job.watch.rss_peak)  # the per-rank peaks summed bound the sampled peak
    first, last = job.steps[0], job.steps[-1]
    window = last[2] - first[2]
    w_read, w_written = last[3] - first[3], last[4] - first[4]
    write_bps, read_bps, direct = disk
    offload = "optimizer only" if a.no_param_offload else "parameters + optimizer"
    print(f"\nZeRO-Infinity: GPT n_layer {a.n_layer} n_head {a.n_head} n_embd {a.n_embd} block "
          f"{a.block_size}, {a.procs} ranks x 1 thread, micro-batch {a.micro_batch} per rank, "
          f"AdamW lr {a.lr:.2g}, bf16, ZeRO-3, NVMe offload of {offload} under {a.nvme_dir} ({fs})\n")
    rows = [
        ("parameters", f"{num_params:,} ({num_params / 1e9:.3g}B)"),
        ("model states (16 B/param) vs RAM", f"{gb(states)} vs {gb(ram)} MemTotal = **{states / ram:.3g}x**"),
        ("state bytes on disk (peak allocated)", f"{gb(job.watch.disk_peak_total)} = {job.watch.disk_peak_total / num_params:.1f} B/param"
         + "".join(f"; {os.path.basename(d)} {gb(n)}" for d, n in job.watch.disk_peak.items())),
        ("peak RSS, sum over ranks", f"{mb(rss)} = **{100 * rss / ram:.1f}% of RAM** (sampled sum "
         f"{mb(job.watch.rss_peak)}; per-rank VmHWM {', '.join(mb(int(r['peak_rss_kb']) * 1024) for r in reports)})"),
        ("step time (gpt_train, steps 2..N, max over ranks)", f"{max(float(r['step_ms']) for r in reports) / 1e3:.1f} s"),
        ("job wall time (launch to exit)", f"{job.seconds:.1f} s; first step line after {first[2]:.1f} s"),
        ("loss, first -> last step", f"{first[1]:.4f} -> {last[1]:.4f}"),
        ("job disk bytes (exact, whole job)", f"read {gb(job.read_bytes)}, written {gb(job.written_bytes)}"),
        ("job disk throughput, whole job", f"{(job.read_bytes + job.written_bytes) / job.seconds / 1e6:,.0f} MB/s "
         f"(read {job.read_bytes / job.seconds / 1e6:,.0f}, write {job.written_bytes / job.seconds / 1e6:,.0f})"),
    ]
    if window > 0 and write_bps > 0:
        busy = (w_read / read_bps + w_written / write_bps) / window
        rows += [
            (f"job disk throughput, steps {first[0] + 1}..{last[0]}",
             f"{(w_read + w_written) / window / 1e6:,.0f} MB/s: read {w_read / window / 1e6:,.0f} "
             f"({100 * w_read / window / read_bps:.0f}% of the disk's), write {w_written / window / 1e6:,.0f} "
             f"({100 * w_written / window / write_bps:.0f}%); {gb((w_read + w_written) / (len(job.steps) - 1))} per step"),
            ("disk busy share in those steps (est.)", f"{100 * busy:.0f}% (read bytes / disk read speed + "
             "written bytes / disk write speed, over the time)"),
        ]
    rows.append(("disk sequential throughput (same folder)",
                 f"write {write_bps / 1e6:,.0f} MB/s, read {read_bps / 1e6:,.0f} MB/s"
                 f" ({'O_DIRECT' if direct else 'buffered: O_DIRECT refused'}, {CHUNK >> 20} MiB requests)"
                 if write_bps else "not measured"))
    print("| figure | value |\n|---|---|")
    for k, v in rows:
        print(f"| {k} | {v} |")
    print("\n| step | loss | wall s | disk read | disk written |\n|---:|---:|---:|---:|---:|")
    prev = (0, 0.0, 0.0, 0, 0)
    for s in job.steps:
        note = " (incl. startup)" if s is first else ""
        print(f"| {s[0]} | {s[1]:.4f} | {s[2] - prev[2]:.1f}{note} | {mb(s[3] - prev[3])} | {mb(s[4] - prev[4])} |")
        prev = s
    for d, n in job.watch.disk_peak.items():
        if n == 0:
            print(f"\nnote: nothing was written under {os.path.basename(d)}/: the build does not offload there yet")
    falling = math.isfinite(last[1]) and last[1] < first[1] and len(job.steps) > 1
    big, low = states / ram >= GOAL_RATIO, rss / ram < GOAL_RSS
    yes = {True: "yes", False: "NO"}
    print(f"\nverdict: model states / RAM = {states / ram:.3g}x (>= {GOAL_RATIO}: {yes[big]}); "
          f"peak RSS {100 * rss / ram:.1f}% of RAM (< {100 * GOAL_RSS:.0f}%: {yes[low]}); "
          f"loss {first[1]:.4f} -> {last[1]:.4f} (falling: {yes[falling]}); run: ok")
    if not falling:
        return 1
    return 3 if a.scale == "full" and not (big and low) else 0


def main():
    a = parse_args()
    ram = meminfo_bytes("MemTotal")
    if (a.compare or a.compare_states) and a.n_layer is None:
        a.n_layer = 2
    if a.n_layer is None:
        a.n_layer = layers_for(ram, a.n_embd, a.block_size)
    params = gpt_params(a.n_layer, a.n_embd, a.block_size)
    fs, free = check_folder(a, params)
    print(f"{params / 1e9:.3f}B parameters: model states {gb(STATE_BYTES_PER_PARAM * params)}, RAM {gb(ram)}, "
          f"{gb(free)} free under {a.nvme_dir} ({fs})", file=sys.stderr)
    if a.dry_run:
        swap = {"optimizer": "DIR/optimizer"} if a.no_param_offload else {"optimizer": "DIR/optimizer", "param": "DIR/param"}
        print(f"n_layer {a.n_layer}\n" + json.dumps(make_config(a, params, swap), indent=1))
        return 0
    job_dir = tempfile.mkdtemp(prefix="ds_infinity_", dir=a.nvme_dir)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the cleanup below runs
    job = None
    try:
        disk = (0.0, 0.0, False)
        if a.disk_test_gib > 0:
            size = int(min(a.disk_test_gib * (1 << 30), free / 10))
            print(f"disk test: {size / 2**30:.1f} GiB under {job_dir}", file=sys.stderr, flush=True)
            disk = disk_speed(job_dir, size)
        if a.compare:
            return compare(a, ram, params, job_dir)
        if a.compare_states:
            return compare_states(a, ram, params, job_dir)
        job = run_job(a, params, job_dir, ["optimizer"] if a.no_param_offload else ["optimizer", "param"])
        return summarize(a, ram, params, job, disk, fs)
    finally:
        if job is not None:
            job.stop()
        shutil.rmtree(job_dir, ignore_errors=True)


def run_job(a, params, job_dir, offloaded, extra=()):
    """One training job with the given parts ("optimizer", "param") swapped under job_dir; `extra`:
    more KEY.PATH=JSON config assignments."""
    swap = {name: os.path.join(job_dir, name) for name in offloaded}
    for d in swap.values():
        os.makedirs(d, exist_ok=True)
    config = os.path.join(job_dir, "ds_config.json")
    with open(config, "w") as f:
        json.dump(make_config(a, params, swap, extra), f, indent=1)
    cmd = [os.path.join(a.build, "bin", "dsrun"), "--num_procs", str(a.procs), "--master_port", str(free_port()),
           os.path.join(a.build, "bin", "gpt_train"), "--deepspeed_config", config, "--zero_init",
           "--data", os.path.join(ROOT, "data", "fortunes.txt"), "--steps", str(a.steps),
           "--n_layer", str(a.n_layer), "--n_head", str(a.n_head), "--n_embd", str(a.n_embd),
           "--block_size", str(a.block_size)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if not a.plain_malloc:
        env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    print(" ".join(cmd), file=sys.stderr, flush=True)
    job = Job(cmd, env, list(swap.values()), a.timeout_min * 60)
    try:
        return job.run()
    finally:
        job.stop()


def measure(a, name, job, job_dir):
    """(name, step time s, peak RSS, disk I/O per step, first loss, final loss) of a finished job, or
    None if it failed; the job folder is emptied for the next one."""
    if job.returncode != 0 or len(job.reports) != a.procs:
        print(f"{name}: job failed (exit {job.returncode}):\n" + "\n".join(job.tail), file=sys.stderr)
        return None
    step_s = max(float(r["step_ms"]) for r in job.reports) / 1e3
    rss = max(sum(int(r["peak_rss_kb"]) * 1024 for r in job.reports), job.watch.rss_peak)
    steps = max(1, len(job.steps) - 1)
    io = (job.steps[-1][3] - job.steps[0][3] + job.steps[-1][4] - job.steps[0][4]) / steps
    shutil.rmtree(job_dir, ignore_errors=True)
    os.makedirs(job_dir)
    return (name, step_s, rss, io, job.steps[0][1], job.steps[-1][1])


def print_rows(a, ram, rows, peer):
    print("| run | step time | vs " + peer + " | peak RSS (sum over ranks) | disk I/O per step | loss, first -> final |")
    print("|---|---:|---:|---:|---:|---:|")
    base = rows[0][1]
    for name, step_s, rss, io, first, loss in rows:
        print(f"| {name} | {step_s:.2f} s | {step_s / base:.2f}x | {mb(rss)} ({100 * rss / ram:.0f}% of RAM) "
              f"| {gb(io)} | {first:.4f} -> {loss:.4f} |")


def compare(a, ram, params, job_dir):
    """The NVMe paths' step time against the in-memory step time on the same model and data."""
    modes = [("in memory", []), ("optimizer on NVMe", ["optimizer"]),
             ("parameters + optimizer on NVMe", ["optimizer", "param"])]
    rows = []
    for name, offloaded in modes:
        row = measure(a, name, run_job(a, params, job_dir, offloaded), job_dir)
        if row is None:
            return 1
        rows.append(row)
    print(f"\nSame model, three ways: GPT n_layer {a.n_layer} n_embd {a.n_embd} ({params / 1e9:.3g}B parameters, "
          f"model states {gb(STATE_BYTES_PER_PARAM * params)}), {a.procs} ranks x 1 thread, bf16, ZeRO-3, "
          f"micro-batch {a.micro_batch}, {a.steps} steps (step time: steps 2..N)\n")
    print_rows(a, ram, rows, "in memory")
    same = len({r[5] for r in rows}) == 1
    print(f"\nfinal losses identical across the three runs: {'yes' if same else 'NO'}")
    return 0 if same else 1


def compare_states(a, ram, params, job_dir):
    """Parameters and optimizer on NVMe, the optimizer state in each format, same model and data."""
    formats = [("fp32 masters + moments (12 B/param on disk)", []),
               ("bf16 masters, fp32 moments (10 B/param)", ["bf16.bf16_master_weights_and_grads=true"]),
               ("bf16 masters + moments (6 B/param)", ["bf16.bf16_master_weights_and_grads=true",
                                                      "bf16.bf16_optimizer_states=true"])]
    rows = []
    for name, extra in formats:
        row = measure(a, name, run_job(a, params, job_dir, ["optimizer", "param"], extra), job_dir)
        if row is None:
            return 1
        rows.append(row)
    print(f"\nSame model, parameters and optimizer on NVMe, three optimizer-state formats: GPT n_layer "
          f"{a.n_layer} n_embd {a.n_embd} ({params / 1e9:.3g}B parameters), {a.procs} ranks x 1 thread, "
          f"bf16, ZeRO-3, micro-batch {a.micro_batch}, {a.steps} steps (step time: steps 2..N)\n")
    print_rows(a, ram, rows, "fp32 masters")
    falling = all(loss < first for _, _, _, _, first, loss in rows)
    print(f"\nloss falls in every run: {'yes' if falling else 'NO'}")
    return 0 if falling else 1


if __name__ == "__main__":
    sys.exit(main())
