# Per-op CPU times of the example GPT's shapes in fp32 and bf16 (1 thread, libtorch 1.13 through
# Debian's python3-torch): which ops bf16 makes slower. Run: /usr/bin/python3 bench/cpu_bf16_ops.py
import torch, time
torch.set_num_threads(1)
x32 = torch.randn(8,128,512, requires_grad=True)
ln = torch.nn.LayerNorm(512)
def bench(f, n=50):
    f(); t=time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter()-t)/n*1e3
for dt in (torch.float32, torch.bfloat16):
    x = x32.detach().to(dt).requires_grad_()
    l = torch.nn.LayerNorm(512).to(dt)
    att = torch.randn(8,8,128,128).to(dt)
    print(dt,
      "ln fwd+bwd %.2f" % bench(lambda: l(x).sum().backward()),
      "softmax %.2f" % bench(lambda: torch.softmax(att,-1)),
      "gelu %.2f" % bench(lambda: torch.nn.functional.gelu(x.detach())),
      "matmul %.2f" % bench(lambda: x.detach() @ torch.ones(512,2048,dtype=dt)),
      "add %.2f" % bench(lambda: x.detach()+x.detach()))
