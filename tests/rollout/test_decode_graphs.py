"""Fixed-shape decode steps (core/rollout/decode_graphs.py): bucket padding and whole-cache keys give the dynamic
step's tokens and log-probs (CPU, eager); on a GPU the recorded CUDA graphs give the eager step's (marked gpu)."""

import pytest
import torch

from core.config import SamplingParams
from core.rollout.decode_graphs import buckets
from core.rollout.engine import RolloutEngine
from core.models import load_causal_lm, load_tokenizer

PROMPTS = ["hi", "a longer prompt here", "xyz 123, abc", "q", "two words"]
SHARED = ["system: be brief. user: hi", "system: be brief. user: a longer prompt here", "system: be brief. user: xyz"]


@pytest.fixture(scope="module")
def model_and_tok(tiny_model_dir):
    return load_causal_lm(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))


def ids_of(tok, texts):
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def test_buckets_are_powers_of_two_below_the_slots_then_the_slots():
    assert buckets(64) == [1, 2, 4, 8, 16, 32, 64]
    assert buckets(6) == [1, 2, 4, 6]
    assert buckets(1) == [1]


def assert_same(a, b, atol=1e-5):
    assert torch.equal(a["responses"], b["responses"]) and torch.equal(a["response_mask"], b["response_mask"])
    torch.testing.assert_close(a["rollout_logprobs"], b["rollout_logprobs"], atol=atol, rtol=0)


@pytest.mark.parametrize("texts,n,slots,temperature", [
    (PROMPTS, 1, 6, 0.0),    # 5 live rows padded to bucket 6, then fewer as rows end
    (PROMPTS, 3, 7, 1.0),    # continuous batching: 15 sequences through 7 slots, sampled
    (SHARED, 2, 5, 0.8),     # a shared prefix at [0, P) of every slot
])
def test_fixed_shape_steps_give_the_dynamic_steps_tokens_and_logprobs(model_and_tok, texts, n, slots, temperature):
    model, tok = model_and_tok
    ids = ids_of(tok, texts)
    p = SamplingParams(n=n, temperature=temperature, max_new_tokens=12, seed=4)
    dynamic = RolloutEngine(model, tok, max_batch_size=slots, decode_graphs=False)
    fixed = RolloutEngine(model, tok, max_batch_size=slots, decode_graphs=True)
    eos_before = dynamic.eos_ids
    free = dynamic.generate(ids, p)
    # an early EOS in some rows: rows retire at different steps, so live counts fall between buckets
    stop = int(free["responses"][1, 2])
    dynamic.eos_ids = fixed.eos_ids = sorted(set(eos_before + [stop]))
    a, b = dynamic.generate(ids, p), fixed.generate(ids, p)
    assert len(set(a["response_mask"].sum(-1).tolist())) > 1
    assert_same(a, b)
    assert fixed.graphs._cache is fixed.cache and fixed.graphs.mask.shape[-1] == fixed.cache.max_len


def test_a_new_cache_gets_new_buffers_and_sleep_lets_the_cache_go(model_and_tok):
    model, tok = model_and_tok
    ids = ids_of(tok, PROMPTS)
    dynamic = RolloutEngine(model, tok, max_batch_size=4, decode_graphs=False)
    fixed = RolloutEngine(model, tok, max_batch_size=4, decode_graphs=True)
    for new in (4, 20):  # the second call needs a longer cache: wake allocates a new one
        p = SamplingParams(n=1, temperature=0, max_new_tokens=new, ignore_eos=True)
        assert_same(dynamic.generate(ids, p), fixed.generate(ids, p))
        assert fixed.graphs.mask.shape[-1] == fixed.cache.max_len
    fixed.sleep()
    assert fixed.cache is None and fixed.graphs._cache is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graphs_replay_the_eager_step_and_follow_weight_updates(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    model = load_causal_lm(str(tiny_model_dir)).cuda()
    ids = ids_of(tok, PROMPTS)
    p = SamplingParams(n=3, temperature=0, max_new_tokens=12)
    eager = RolloutEngine(model, tok, max_batch_size=8, decode_graphs=False)
    graphed = RolloutEngine(model, tok, max_batch_size=8)   # default on a GPU
    assert graphed.graphs is not None and graphed.graphs.capture
    assert eager.fused == {"norms": 2 * 2 + 1}   # one fused kernel per norm on a GPU (gpu_kernels; shared model)
    assert_same(eager.generate(ids, p), graphed.generate(ids, p), atol=1e-4)
    assert len(graphed.graphs._graphs) > 1  # several buckets recorded as rows retired
    # an in-place weight update reaches the recorded graphs
    fresh = load_causal_lm(str(tiny_model_dir))
    scaled = [(k, v.detach() * 1.5) for k, v in fresh.named_parameters()]
    graphed.update_weights(scaled)  # the engines share the model: both see the new weights
    assert_same(eager.generate(ids, p), graphed.generate(ids, p), atol=1e-4)
