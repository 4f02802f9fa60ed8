# Reads a torch.save file with Python's torch.load (weights_only=True: the restricted unpickler
# torch 2.6+ uses by default) and compares it with a safetensors file of the same tensors:
#   python3 torch_load_compare.py FILE.bin FILE.safetensors
# Exit 0 when the torch.save file holds a dict with the same keys in the same order, and
# every tensor has the same dtype, shape and values (NaN-aware bitwise equality).
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpoint_read_safetensors import load as load_safetensors  # noqa: E402


def main():
    loaded = torch.load(sys.argv[1], map_location="cpu", weights_only=True)
    want = load_safetensors(sys.argv[2])
    if not isinstance(loaded, dict):
        print("not a dict:", type(loaded))
        sys.exit(1)
    if list(loaded.keys()) != list(want.keys()):
        print("keys differ:", list(loaded.keys())[:5], "vs", list(want.keys())[:5])
        sys.exit(1)
    bad = 0
    for name, w in want.items():
        got = loaded[name]
        same = got.dtype == w.dtype and got.shape == w.shape and got.is_contiguous()
        if same and w.numel() > 0:
            same = torch.equal(got.view(-1).view(torch.uint8), w.view(-1).view(torch.uint8))
        if not same:
            print("MISMATCH", name, got.dtype, tuple(got.shape), "vs", w.dtype, tuple(w.shape))
            bad += 1
    print("checked", len(want), "tensors;", bad, "mismatches")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
