# Writes torch.save files as PyTorch users have them, for the C++ reader's tests, and what they
# hold as JSON:
#   python3 torch_save_fixtures.py OUT_DIR
# OUT_DIR/state_dict.bin      a module's state_dict() (an OrderedDict with _metadata, a buffer, a
#                             bf16 parameter, two names sharing one storage), protocol 2
# OUT_DIR/state_dict_p4.bin   the same with pickle_protocol=4 (frames, memoize, stack globals)
# OUT_DIR/views.bin           {"param": nn.Parameter, "narrowed": a view at a storage offset,
#                             "transposed": a non-contiguous view, "int": int64 ids}
# OUT_DIR/expected.json       {file: {name: {"dtype", "shape", "values" (flat, as floats)}}}
import json
import sys

import torch


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(5, 3)
        self.proj = torch.nn.Linear(3, 4)
        self.head = torch.nn.Linear(3, 5, bias=False)
        self.head.weight = self.embed.weight  # tied: one storage, two names
        self.norm = torch.nn.LayerNorm(4).to(torch.bfloat16)
        self.register_buffer("steps", torch.tensor([7], dtype=torch.int64))


def describe(state):
    return {name: {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape),
                   "values": t.detach().reshape(-1).to(torch.float64).tolist()}
            for name, t in state.items()}


def main():
    out = sys.argv[1]
    torch.manual_seed(0)
    state = Tiny().state_dict()
    big = torch.arange(12, dtype=torch.float32)
    views = {"param": torch.nn.Parameter(torch.full((3,), 0.5)),
             "narrowed": big[4:10].view(2, 3),
             "transposed": big.view(3, 4).t(),
             "int": torch.tensor([[1, -2], [3000000000, 4]])}
    torch.save(state, out + "/state_dict.bin")
    torch.save(state, out + "/state_dict_p4.bin", pickle_protocol=4)
    torch.save(views, out + "/views.bin")
    expected = {"state_dict.bin": describe(state), "state_dict_p4.bin": describe(state),
                "views.bin": describe(views)}
    with open(out + "/expected.json", "w") as f:
        json.dump(expected, f)


if __name__ == "__main__":
    main()
