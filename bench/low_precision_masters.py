#!/usr/bin/python3
"""fp32 masters against DeepSpeed's low-precision masters on the same GPT, data and ranks.

    /usr/bin/python3 bench/low_precision_masters.py [--build build] [--procs 2] [--steps 20]
                                                   [--stages 1,2,3] [--n_layer 4] [--n_embd 512]
                                                   [--micro_batch 2]

For each ZeRO stage it trains the example GPT in bf16 with offload_optimizer "cpu" three ways:
fp32 masters (the default, the peer), bf16.bf16_master_weights_and_grads (bf16 masters, fp32
moments) and that with bf16.bf16_optimizer_states (bf16 moments), each twice: once for speed and
once for memory (MALLOC_MMAP_THRESHOLD_=65536, so freed blocks go back to the OS and VmHWM shows
what was needed). Prints a markdown table: step time, tokens/s, loss after the last step, the
optimizer's bytes per rank (masters kept apart from the partition + moments, from the engine's
memory report) and per parameter of the rank's partition, model-state bytes per rank and peak RSS
per rank (max over ranks).
"""
import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zero_memory_and_speed import ROOT, run  # noqa: E402  (dsrun + gpt_train, its report lines)

VARIANTS = [
    ("fp32 masters, fp32 moments (default)", {}),
    ("bf16 masters, fp32 moments", {"bf16_master_weights_and_grads": True}),
    ("bf16 masters, bf16 moments",
     {"bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}),
]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--stages", default="1,2,3")
    p.add_argument("--n_layer", type=int, default=4)
    p.add_argument("--n_head", type=int, default=8)
    p.add_argument("--n_embd", type=int, default=512)
    p.add_argument("--micro_batch", type=int, default=2)
    a = p.parse_args()
    model = ["--n_layer", str(a.n_layer), "--n_head", str(a.n_head), "--n_embd", str(a.n_embd),
             "--block_size", "128"]
    data = os.path.join(ROOT, "data", "fortunes.txt")
    base = json.load(open(os.path.join(ROOT, "examples", "gpt", "ds_config.json")))
    base["train_micro_batch_size_per_gpu"] = a.micro_batch
    base["steps_per_print"] = 0
    base["bf16"] = {"enabled": True}
    base.pop("fp16", None)
    dsrun = os.path.join(a.build, "bin", "dsrun")
    rows = []
    port = 29800
    with tempfile.TemporaryDirectory() as tmp:
        for stage in [int(s) for s in a.stages.split(",")]:
            for name, keys in VARIANTS:
                cfg = json.loads(json.dumps(base))
                cfg["zero_optimization"]["stage"] = stage
                cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
                cfg["bf16"].update(keys)
                path = os.path.join(tmp, f"cfg{stage}{len(keys)}.json")
                json.dump(cfg, open(path, "w"))
                prog = [os.path.join(a.build, "bin", "gpt_train"), "--deepspeed_config", path,
                        "--data", data]
                results = {}
                for mode, env in (("speed", {}), ("memory", {"MALLOC_MMAP_THRESHOLD_": "65536"})):
                    port += 1
                    cmd = [dsrun, "--num_procs", str(a.procs), "--master_port", str(port)]
                    cmd += prog + model + ["--steps", str(a.steps)]
                    results[mode] = run(cmd, env)
                    print(f"  ZeRO-{stage} {name} ({mode}): done", file=sys.stderr, flush=True)
                speed, mem = results["speed"], results["memory"]
                psi = int(speed[0]["num_params"])
                rows.append({
                    "name": f"ZeRO-{stage} {name}",
                    "psi": psi,
                    "step_ms": max(float(r["step_ms"]) for r in speed),
                    "tokens_per_s": min(float(r["tokens_per_s"]) for r in speed),
                    "loss": float(speed[0]["final_loss"]),
                    "optim": max(int(r["optim_bytes"]) for r in mem),
                    "model_state": max(int(r["model_state_bytes"]) for r in mem),
                    "rss_kb": max(int(r["peak_rss_kb"]) for r in mem),
                })
    print(f"\n{a.procs} ranks x 1 thread, GPT n_layer {a.n_layer} n_head {a.n_head} n_embd "
          f"{a.n_embd} block 128, {rows[0]['psi'] / 1e6:.1f}M parameters, bf16, micro-batch "
          f"{a.micro_batch} per rank, AdamW, offload_optimizer cpu, {a.steps} steps (first not "
          f"timed)\n")
    print("| run | step time (ms) | tokens/s | loss after last step | optimizer MB per rank | "
          "optimizer bytes per partition element | model-state MB per rank | "
          "peak RSS MB per rank |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        per_element = r["optim"] / (r["psi"] / a.procs)
        print(f"| {r['name']} | {r['step_ms']:.0f} | {r['tokens_per_s']:.0f} | {r['loss']:.4f} | "
              f"{r['optim'] / 1e6:.1f} | {per_element:.2f} | {r['model_state'] / 1e6:.1f} | "
              f"{r['rss_kb'] / 1024:.0f} |")


if __name__ == "__main__":
    main()
