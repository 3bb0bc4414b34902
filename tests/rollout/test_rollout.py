"""The embedded rollout engine on a tiny real transformers model: equivalence with transformers, log-probs, masks."""

import pytest
import torch

from core.config import RolloutConfig, SamplingParams
from core.rollout import packed
from core.rollout.engine import RolloutEngine
from core.rollout.sampling import filter_logits
from core.models import load_causal_lm, load_tokenizer

PROMPTS = ["hi", "a longer prompt here", "xyz 123, abc"]


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return RolloutEngine(load_causal_lm(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir)), max_batch_size=4)


def ids_of(engine, texts):
    return [engine.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def test_greedy_equals_transformers_generate_token_for_token(engine):
    ids = ids_of(engine, PROMPTS)
    out = engine.generate(ids, SamplingParams(temperature=0, max_new_tokens=12))
    for i, p in enumerate(ids):
        ref = engine.model.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False,
                                    pad_token_id=engine.pad_id)[0, len(p):]
        ours = out["responses"][i][out["response_mask"][i] > 0]
        assert torch.equal(ours, ref[: len(ours)]) and len(ours) == len(ref), (i, ours, ref)


def teacher_forced_logprobs(model, batch, temperature):
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   position_ids=batch["position_ids"]).logits.float()
    Tp = batch["prompts"].shape[1]
    logits = logits[:, Tp - 1:-1] / temperature
    return logits.log_softmax(-1).gather(-1, batch["responses"][..., None]).squeeze(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_equal_a_teacher_forced_forward(engine, temperature):
    out = engine.generate(ids_of(engine, PROMPTS), SamplingParams(n=3, temperature=temperature, max_new_tokens=10, seed=1))
    with torch.no_grad():
        ref = teacher_forced_logprobs(engine.model, out, temperature)
    mask = out["response_mask"]
    diff = ((ref - out["rollout_logprobs"]).abs() * mask).sum() / mask.sum()
    assert diff < 1e-3 and ((ref - out["rollout_logprobs"]).abs() * mask).max() < 1e-3


def test_n_samples_are_interleaved_and_seeded(engine):
    ids = ids_of(engine, PROMPTS[:2])
    p = SamplingParams(n=4, temperature=1.0, max_new_tokens=8, seed=7)
    a, b = engine.generate(ids, p), engine.generate(ids, p)
    assert len(a) == 8 and torch.equal(a["responses"], b["responses"])
    assert torch.equal(a["prompts"][0], a["prompts"][3]) and not torch.equal(a["prompts"][3], a["prompts"][4])
    c = engine.generate(ids, SamplingParams(n=4, temperature=1.0, max_new_tokens=8, seed=8))
    assert not torch.equal(a["responses"], c["responses"])


def test_top_k_one_is_greedy(engine):
    ids = ids_of(engine, PROMPTS)
    greedy = engine.generate(ids, SamplingParams(temperature=0, max_new_tokens=8))
    topk1 = engine.generate(ids, SamplingParams(temperature=1.3, top_k=1, max_new_tokens=8, seed=3))
    assert torch.equal(greedy["responses"], topk1["responses"])


def test_filter_logits_top_p_and_top_k():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = filter_logits(logits, top_k=-1, top_p=0.7).isfinite()
    assert kept.tolist() == [[True, True, False, False]]  # 0.5 + 0.3 reaches 0.7
    assert filter_logits(logits, top_k=3, top_p=1.0).isfinite().tolist() == [[True, True, True, False]]


def test_eos_ends_a_response_and_is_masked_after(engine):
    ids = ids_of(engine, PROMPTS)
    free = engine.generate(ids, SamplingParams(temperature=0, max_new_tokens=10))
    stop_tok = int(free["responses"][0, 2])  # make the 3rd greedy token of row 0 an EOS
    eos_before = engine.eos_ids
    engine.eos_ids = sorted(set(eos_before + [stop_tok]))
    try:
        out = engine.generate(ids, SamplingParams(temperature=0, max_new_tokens=10))
    finally:
        engine.eos_ids = eos_before
    first = (free["responses"][0] == stop_tok).nonzero()[0].item()
    assert out["response_mask"][0].tolist() == [1.0] * (first + 1) + [0.0] * (out["responses"].shape[1] - first - 1)
    assert torch.all(out["responses"][0, first + 1:] == engine.pad_id)
    assert torch.all(out["rollout_logprobs"][out["response_mask"] == 0] == 0)
    # attention mask and input_ids line up with prompts + responses
    assert torch.equal(out["input_ids"], torch.cat([out["prompts"], out["responses"]], 1))
    assert torch.equal(out["attention_mask"][:, out["prompts"].shape[1]:], out["response_mask"].long())


def test_update_weights_changes_generation_and_checks_shapes(engine, tiny_model_dir):
    fresh = load_causal_lm(str(tiny_model_dir))
    ids = ids_of(engine, PROMPTS)
    before = engine.generate(ids, SamplingParams(temperature=0, max_new_tokens=6))["responses"]
    scaled = [(n, p.detach() * 1.5) for n, p in fresh.named_parameters()]
    assert engine.update_weights(scaled) == sum(p.numel() * 4 for _, p in scaled)
    after = engine.generate(ids, SamplingParams(temperature=0, max_new_tokens=6))["responses"]
    engine.update_weights(fresh.named_parameters())  # restore
    assert not torch.equal(before, after)
    with pytest.raises(ValueError, match="weight model.norm.weight: engine shape"):
        engine.update_weights([("model.norm.weight", torch.zeros(3))])
    with pytest.raises(KeyError, match="no parameter 'nope'"):
        engine.update_weights([("nope", torch.zeros(1))])


def test_continuous_batching_gives_the_same_sequences_with_fewer_slots(engine, tiny_model_dir):
    # 3 prompts x n=3 = 9 sequences through 3 slots (queueing, slot refills, slot moves) vs 9 slots at once
    ids = ids_of(engine, PROMPTS)
    p = SamplingParams(n=3, temperature=0, max_new_tokens=10)
    wide = RolloutEngine(engine.model, engine.tokenizer, max_batch_size=9).generate(ids, p)
    narrow = RolloutEngine(engine.model, engine.tokenizer, max_batch_size=3).generate(ids, p)
    assert torch.equal(wide["responses"], narrow["responses"])
    torch.testing.assert_close(wide["rollout_logprobs"], narrow["rollout_logprobs"], atol=1e-5, rtol=0)
    # shared prefill: the n greedy samples of one prompt are identical
    assert torch.equal(wide["responses"][0], wide["responses"][2]) and torch.equal(wide["prompts"][3], wide["prompts"][5])


def test_sequences_of_uneven_lengths_retire_and_refill(engine):
    # EOS at a token that appears early in some rows only: rows finish at different steps and slots get refilled
    ids = ids_of(engine, PROMPTS * 3)
    free = engine.generate(ids, SamplingParams(temperature=0, max_new_tokens=10))
    stop_tok = int(free["responses"][1, 1])
    eos_before = engine.eos_ids
    engine.eos_ids = sorted(set(eos_before + [stop_tok]))
    try:
        small = RolloutEngine(engine.model, engine.tokenizer, max_batch_size=2)
        small.eos_ids = engine.eos_ids
        out = small.generate(ids, SamplingParams(temperature=0, max_new_tokens=10))
    finally:
        engine.eos_ids = eos_before
    lengths = out["response_mask"].sum(-1).long().tolist()
    for b, row in enumerate(free["responses"]):
        hits = (row == stop_tok).nonzero()
        expect = int(hits[0]) + 1 if len(hits) else 10
        assert lengths[b] == expect
        assert torch.equal(out["responses"][b, :expect], row[:expect])
    assert len(set(lengths)) > 1


def test_stop_strings_end_a_response(engine):
    ids = ids_of(engine, PROMPTS)
    free = engine.generate(ids, SamplingParams(temperature=0, max_new_tokens=12))
    text = engine.decode(free)[0]
    stop = text[3:5]
    out = engine.generate(ids, SamplingParams(temperature=0, max_new_tokens=12, stop=(stop,)))
    got = engine.decode(out)[0]
    assert stop in got and len(got) < len(text) and text.startswith(got)


def test_sleep_frees_the_kv_cache_and_generate_wakes_it(engine):
    from core.memory import keep_freed_memory, release_freed_memory, rss_bytes

    keep_freed_memory()  # as in every CPU worker (this test process may not have made one yet)
    big = RolloutEngine(engine.model, engine.tokenizer, max_batch_size=256)
    size = big.wake(max_len=4096)  # 256 slots x 4096 positions
    assert size == big.cache.nbytes and size > 50 << 20
    before = rss_bytes()
    assert big.sleep() == size and big.cache is None
    # the pages stay with the process: a trainer in it (colocated) or the next wake takes them without faults
    # (most of them: one of the per-layer blocks may land past a hole glibc's aligned allocation leaves)
    big.wake(max_len=4096)
    assert rss_bytes() - before < size // 2
    big.sleep()
    release_freed_memory()
    assert before - rss_bytes() > size // 2  # and on request they go back to the OS
    out = big.generate(ids_of(engine, PROMPTS), SamplingParams(temperature=0, max_new_tokens=4))
    assert big.cache is not None and out["responses"].shape == (3, 4)


SHARED = ["system: be brief. user: hi", "system: be brief. user: a longer prompt here", "system: be brief. user: xyz"]


def test_a_shared_prefix_is_found_and_leaves_each_prompt_a_token():
    from core.rollout.run import shared_prefix_length

    assert shared_prefix_length([[1] * 10 + [2], [1] * 10 + [3, 4]]) == 10
    assert shared_prefix_length([[1] * 10, [1] * 10]) == 9          # each keeps one token of its own
    assert shared_prefix_length([[1] * 7 + [2], [1] * 7 + [3]]) == 0  # below MIN_SHARED_PREFIX
    assert shared_prefix_length([[1] * 20]) == 0                     # one prompt: nothing to share


@pytest.mark.parametrize("slots", [9, 3])
def test_shared_prefix_prefill_gives_what_separate_prefills_give(engine, slots):
    # greedy tokens identical and log-probs equal (fp32), with room for all and with continuous batching
    ids = ids_of(engine, SHARED)
    p = SamplingParams(n=3, temperature=0, max_new_tokens=10)
    sep = RolloutEngine(engine.model, engine.tokenizer, max_batch_size=slots, share_prefix=False).generate(ids, p)
    shared_engine = RolloutEngine(engine.model, engine.tokenizer, max_batch_size=slots)
    shared = shared_engine.generate(ids, p)
    assert torch.equal(sep["responses"], shared["responses"]) and torch.equal(sep["response_mask"], shared["response_mask"])
    torch.testing.assert_close(sep["rollout_logprobs"], shared["rollout_logprobs"], atol=1e-5, rtol=0)


def test_sampled_logprobs_with_a_shared_prefix_equal_a_teacher_forced_forward(engine):
    out = engine.generate(ids_of(engine, SHARED), SamplingParams(n=2, temperature=0.8, max_new_tokens=10, seed=5))
    with torch.no_grad():
        ref = teacher_forced_logprobs(engine.model, out, 0.8)
    assert (((ref - out["rollout_logprobs"]).abs() * out["response_mask"]).max()) < 1e-4


@pytest.mark.parametrize("sleep", [True, False])
def test_the_rollout_role_frees_the_kv_cache_after_generating_when_asked(tiny_model_dir, sleep):
    from core.protocol import Batch
    from core.rollout.worker import RolloutWorker
    from core.worker import WorkerContext

    worker = RolloutWorker(WorkerContext(0, 1, 0, torch.device("cpu")),
                           RolloutConfig(model=str(tiny_model_dir), dtype="float32", max_prompt_length=32,
                                         sleep_after_generate=sleep))
    prompts = Batch(non_tensors={"prompt": [[{"role": "user", "content": "hi"}]]})
    out = worker.generate(prompts, SamplingParams(n=2, max_new_tokens=4))
    assert out["responses"].shape == (2, 4) and (worker.engine.cache is None) == sleep


def test_the_additive_mask_stays_on_the_boolean_masks_device():
    # decode builds its mask on the engine's device: a CPU result there would fail on CUDA ("meta" stands in)
    from core.rollout.run import _additive

    allowed = torch.tensor([[True, False]])
    assert _additive(allowed.to("meta"), torch.bfloat16).device.type == "meta"
    out = _additive(allowed, torch.float32)
    assert out.tolist() == [[0.0, torch.finfo(torch.float32).min]]


@pytest.mark.skipif(not packed.kernel_usable(torch.float32),
                    reason="batch invariance rests on our CPU kernels (HYBRIDRL_CPU_KERNELS=0 or not built: torch's "
                           "matmuls and SDPA block by the batch's shape)")
@pytest.mark.parametrize("slots", [8, 3])
@pytest.mark.parametrize("texts", [["a longer prompt here", "xyz 123, abc, and more words", "hi"], SHARED],
                         ids=["apart", "shared-prefix"])
def test_a_sequence_samples_alike_whatever_its_batch_neighbours(engine, slots, texts):
    """fp32 on our kernels: a sequence's tokens and log-probs bit for bit the same alone and beside longer and shorter
    prompts (other cache lengths, padding, a shared prefix prefilled once with a gap before each prompt's rest, other
    batch rows), with room for all or through 3 slots: each row's linears, norms, attention (the live keys summed in
    their order, masked ones skipped) and sampling see only that row."""
    a, others = ids_of(engine, texts[:1]), ids_of(engine, texts[1:])
    p = SamplingParams(n=2, temperature=1.0, max_new_tokens=12)
    small = RolloutEngine(engine.model, engine.tokenizer, max_batch_size=slots)
    alone = small.generate(a, p, seeds=[11, 12])
    beside = small.generate([others[0], a[0], others[1]], p, seeds=[1, 2, 11, 12, 3, 4])
    for key in ("responses", "response_mask", "rollout_logprobs"):
        assert torch.equal(alone[key], beside[key][2:4, :alone[key].shape[1]]), key
