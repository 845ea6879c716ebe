import statistics, time, sys
import numpy as np, torch
exec(open("reports/measured/spr-kvm-2c-2026-12-05/session4/decode-call-cost.py").read().split("ways = {")[0].replace('dtype = sys.argv[1] if len(sys.argv) > 1 else "int4"', 'dtype = "int4"'))
New = hf.colibri_block_class()
class Old(New):
    def forward(self, hidden_states):
        shape, dtype = hidden_states.shape, hidden_states.dtype
        if hidden_states.device.type != "cpu": raise ValueError
        if not shape or shape[-1] != self.layer.hidden: raise ValueError
        x = hidden_states.detach().reshape(-1, shape[-1])
        bf16 = dtype == torch.bfloat16
        if not bf16 and x.dtype != torch.float32: x = x.to(torch.float32)
        x = x.contiguous()
        out = torch.empty_like(x)
        self.layer._forward_ptrs(x.data_ptr(), out.data_ptr(), x.shape[0], bf16=bf16)
        return (out if out.dtype == dtype else out.to(dtype)).view(shape)
olds = [Old(Shim(L), "o") for L in layers]
news = [New(Shim(L), "n") for L in layers]
def run(ms):
    ts=[]
    with torch.no_grad():
        for i in range(CALLS):
            t0=time.perf_counter(); ms[i % n](xb[i % 16].view(1, 1, -1)); ts.append(time.perf_counter()-t0)
    return statistics.median(ts)
res = {"old": [], "new": [], "py": []}
for r in range(6):
    order = [("old", lambda: run(olds)), ("new", lambda: run(news)), ("py", py_loop)]
    order = order[r % 3:] + order[:r % 3]
    for k, f in order: res[k].append(f())
for k, v in res.items(): print(k, round(statistics.median(v)*1e6,1), [round(t*1e6) for t in v])
print("new-old per round", [round((a-b)*1e6) for a, b in zip(res["new"], res["old"])])
