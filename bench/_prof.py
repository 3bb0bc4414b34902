import sys, time, torch
from core.models import resolve_model, load_causal_lm, load_tokenizer
from core.rollout.engine import RolloutEngine
from core.rollout.weight_sync import DeltaReceiver
from core.weight_delta import Bucket, encode
from core.train.policy import bucket_names
dtype = getattr(torch, sys.argv[1]); lr = float(sys.argv[2])
path = resolve_model("SmolLM2-135M-Instruct")
master = load_causal_lm(path, dtype=torch.float32)
eng = RolloutEngine(load_causal_lm(path, dtype=dtype), load_tokenizer(path), 64, single_copy=True)
params = dict(master.named_parameters())
plan = bucket_names(((n, p.numel() * 4) for n, p in params.items()), 64 << 20)
shadow = {}
def sync(base, sid):
    rec.load  # noqa
    t_enc = t_load = 0; sent = 0; changed = total = 0
    for names in plan:
        t0 = time.perf_counter()
        parts = []
        for n in names:
            new = params[n].detach().to(dtype=dtype, copy=True).reshape(-1)
            old = shadow.get(n)
            part, c = encode(n, tuple(params[n].shape), 0, new, old, delta=base is not None)
            shadow[n] = new; parts.append(part); changed += c; total += new.numel()
        b = Bucket(parts, base if any(p.k >= 0 for p in parts) else None, 0, 0).seal()
        t1 = time.perf_counter()
        _, prob = rec.load([b]); assert prob is None, prob
        t2 = time.perf_counter()
        t_enc += t1 - t0; t_load += t2 - t1; sent += b.nbytes
    rec.finish(sid, base is not None)
    return t_enc, t_load, sent / 2**20, changed / total
rec = DeltaReceiver(eng)
print("full", sync(None, "1"))
torch.manual_seed(0)
with torch.no_grad():
    for p in params.values():
        p.add_(torch.sign(torch.randn_like(p)) * lr)
import cProfile, pstats
pr = cProfile.Profile(); pr.enable()
print("delta", sync("1", "2"))
pr.disable(); pstats.Stats(pr).sort_stats("cumtime").print_stats(14)
w = {n: eng.weight(n) for n in params}
assert all(torch.equal(w[n], params[n].to(dtype)) for n in params)
