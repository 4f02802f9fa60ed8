# Reads a safetensors file with PyTorch alone (no safetensors package) and compares every tensor
# with the raw little-endian float32 dumps listed in expected.json:
#   python3 checkpoint_read_safetensors.py FILE.safetensors EXPECTED_DIR
# expected.json: [{"name": ..., "shape": [...], "file": "<raw .bin>"}]. Exit 0 when all match.
import json
import struct
import sys

import torch

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
          "U8": torch.uint8, "BOOL": torch.bool}


def load(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = bytearray(blob[8 + n:])
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        t = torch.frombuffer(data[begin:end], dtype=DTYPES[entry["dtype"]]) if end > begin else \
            torch.empty(0, dtype=DTYPES[entry["dtype"]])
        out[name] = t.reshape(entry["shape"]).clone()
    return out


def main():
    tensors = load(sys.argv[1])
    with open(sys.argv[2] + "/expected.json") as f:
        expected = json.load(f)
    bad = 0
    for e in expected:
        with open(sys.argv[2] + "/" + e["file"], "rb") as f:
            want = torch.frombuffer(bytearray(f.read()), dtype=torch.float32).reshape(e["shape"])
        got = tensors.get(e["name"])
        if got is None or got.dtype != torch.float32 or not torch.equal(got, want):
            print("MISMATCH", e["name"], None if got is None else (got.dtype, tuple(got.shape)))
            bad += 1
    print("checked", len(expected), "tensors;", bad, "mismatches; file has", len(tensors))
    sys.exit(1 if bad or len(tensors) != len(expected) else 0)


if __name__ == "__main__":
    main()
