"""Streaming generation on the embedded engine (``core.rollout.stream``), checked by regeneration: every token of a
stream equals what the weights its version tag names sample from the whole prefix with the token's own uniform,
computed here by a plain transformers forward (no KV cache, no engine code) -- across weight updates mid-sequence
(partial rollouts), cohorts added while others run, and chunked calls. Each check is shown to catch the fault it
guards against (a version tag off by one, a KV cache left from the old weights)."""

from dataclasses import replace

import pytest
import torch

from core.config import SamplingParams
from core.models import load_causal_lm, load_tokenizer
from core.protocol import Batch
from core.rollout.engine import RolloutEngine
from core.rollout.sampling import sequence_seeds
from core.rollout.stream import StreamState, versions_tensor
from tests.rollout.regenerate import check_regenerated, reference_models

PROMPTS = ["hi", "a longer prompt here", "xyz 123, abc", "another one"]
P = SamplingParams(n=2, temperature=1.0, max_new_tokens=12, seed=3, ignore_eos=True)


@pytest.fixture(scope="module")
def weights(tiny_model_dir):
    """Two weight versions: the tiny model's, and a perturbation of it (a policy update)."""
    v0 = {k: v.detach().clone() for k, v in load_causal_lm(str(tiny_model_dir)).named_parameters()}
    g = torch.Generator().manual_seed(0)
    v1 = {k: v + 0.05 * torch.randn(v.shape, generator=g) * v.std().clamp(min=1e-3) for k, v in v0.items()}
    return [v0, v1]


@pytest.fixture
def engine(tiny_model_dir):
    return RolloutEngine(load_causal_lm(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir)), max_batch_size=5)


@pytest.fixture(scope="module")
def reference(tiny_model_dir, weights):
    return reference_models(tiny_model_dir, weights)


def ids_of(engine, texts):
    return [engine.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def run_stream(engine, weights, prompts, update_after=None, chunk=3, reprefill=True):
    """Stream ``prompts`` (one cohort) to the end in chunks of ``chunk`` decode steps; after ``update_after`` decode
    steps load the next weight version as a sync does. Returns the finished batch in prompt order."""
    s = StreamState(engine, P, max_prompt_length=32, recompute_kv=reprefill)
    seeds = sequence_seeds(11, len(prompts) * P.n)
    s.add(prompts, seeds, keys=list(range(len(prompts))))
    parts, steps = [], 0
    while s.run.queue or s.run.live:
        done, _ = s.advance(chunk)
        steps += chunk
        parts += [done] if done is not None else []
        if update_after is not None and steps == update_after:
            engine.update_weights(weights[1].items())
            s.reweighted()
    out = Batch.concat(parts)
    order = sorted(range(len(out)), key=lambda b: (out["stream_key"][b], b))
    return out.index(order)


def test_a_stream_without_updates_equals_generate_bit_for_bit(engine, weights):
    ids = ids_of(engine, PROMPTS)
    engine.update_weights(weights[0].items())
    ref = engine.generate(ids, P)                 # sequence_seeds(P.seed, ...) per sample
    s = StreamState(engine, P, max_prompt_length=32)
    s.add(ids, sequence_seeds(P.seed, len(ids) * P.n), keys=list(range(len(ids))))
    parts = []
    while s.run.queue or s.run.live:
        done, started = s.advance(2)
        parts += [done] if done is not None else []
        assert set(started.values()) <= {0}
    out = Batch.concat(parts)
    order = sorted(range(len(out)), key=lambda b: (out["stream_key"][b], b))
    out = out.index(order)
    T = ref["responses"].shape[1]
    assert torch.equal(out["responses"][:, :T], ref["responses"])
    assert torch.equal(out["rollout_logprobs"][:, :T], ref["rollout_logprobs"])
    assert torch.equal(out["rollout_versions"], torch.zeros_like(out["rollout_versions"]))


def test_every_streamed_token_is_what_its_version_samples_across_an_update(engine, weights, reference):
    ids = ids_of(engine, PROMPTS)
    engine.update_weights(weights[0].items())
    out = run_stream(engine, weights, ids, update_after=6)
    v = out["rollout_versions"][out["response_mask"] > 0]
    assert set(v.tolist()) == {0.0, 1.0}                       # partial rollouts: tokens of both versions
    spanning = [(r[m > 0] == 0).any() and (r[m > 0] == 1).any()
                for r, m in zip(out["rollout_versions"], out["response_mask"])]
    assert any(spanning)
    assert torch.equal(versions_tensor(out), out["rollout_versions"][:, 0])
    check_regenerated(reference, out)


def test_the_regeneration_check_catches_a_version_tag_off_by_one(engine, weights, reference):
    ids = ids_of(engine, PROMPTS[:2])
    engine.update_weights(weights[0].items())
    out = run_stream(engine, weights, ids, update_after=6)
    with pytest.raises(AssertionError):
        check_regenerated(reference, out, shift=1)


def test_the_regeneration_check_catches_a_kv_cache_left_from_the_old_weights(engine, weights, reference):
    """``trainer.async.partial_kv: keep`` on purpose: the tokens after the update are drawn over the old KV, which
    is not what the new weights sample on the prefix."""
    ids = ids_of(engine, PROMPTS[:2])
    engine.update_weights(weights[0].items())
    out = run_stream(engine, weights, ids, update_after=6, reprefill=False)
    with pytest.raises(AssertionError):
        check_regenerated(reference, out)


def test_cohorts_added_while_others_run_an_update_and_aborted_groups(engine, weights, reference):
    """Groups added mid-stream (another shared prefix, prefilled at a free slot while others decode) join the
    running batch; a weight update lands while some are in flight and some still queued (their prefix is prefilled
    again, with the new weights); an aborted group frees its slots and never comes back; every finished sample
    regenerates from the versions its tokens name."""
    engine.update_weights(weights[0].items())
    first = ids_of(engine, ["one shared preamble: " + p for p in PROMPTS[:2]])
    second = ids_of(engine, ["a different preamble: " + p for p in PROMPTS])
    s = StreamState(engine, P, max_prompt_length=48)
    seeds = sequence_seeds(5, 12)
    s.add(first, seeds[:4], keys=["a", "b"])
    assert s.run.cohorts[0].P >= 8                      # the prefix is shared: the cohort path runs
    got, started = [], {}
    for k in range(40):
        if k == 1:
            s.add(second, seeds[4:], keys=["c", "d", "e", "f"])
            s.abort({"b"})
        if k == 3:
            engine.update_weights(weights[1].items())
            s.reweighted()
        done, st = s.advance(2)
        started |= st
        got += [done] if done is not None else []
        if k > 3 and not (s.run.queue or s.run.live):
            break
    assert not (s.run.queue or s.run.live)
    out = Batch.concat(got)
    assert sorted(set(out["stream_key"])) == ["a", "c", "d", "e", "f"] and set(started) == {"a", "b", "c", "d", "e", "f"}
    assert sorted(out["rollout_seeds"].tolist()) == sorted(seeds[0:2] + seeds[4:])
    assert set(started.values()) == {0, 1}              # groups started under each version
    check_regenerated(reference, out)


def test_a_stop_string_across_two_chunks_ends_the_sequence_at_the_token_that_completes_it(engine, weights):
    """vLLM streams in chunks (``ChunkedRun``): each engine call sees its chunk's tokens only, so a stop string whose
    first token closed one chunk and whose last opens the next escaped it. Run here on the embedded engine: with a
    stop string made of such a pair, the sequence ends at the token that completes it (the rule of one call,
    ``ends_in_stop``), its tokens those of the run without the stop string up to there."""
    from core.rollout.run import ends_in_stop
    from core.rollout.stream import ChunkedRun

    engine.update_weights(weights[0].items())
    ids = ids_of(engine, PROMPTS[:1])

    def chunked(k, params):
        run = ChunkedRun(engine, params)
        run.add_prompts(ids, [7], params.max_new_tokens)
        while run.live or run.queue:
            run.step(k)
        return run

    k, plain = 3, replace(P, n=1)
    free = chunked(k, plain).tokens[0]
    assert len(free) == plain.max_new_tokens

    def completed_at(stop):  # the first length whose text holds the stop string
        return next(j for j in range(1, len(free) + 1) if ends_in_stop(engine.tokenizer, free[:j], (stop,)))

    # the last token of a chunk and the first of the next, not completed before
    b, stop = next((b, engine.tokenizer.decode(free[b - 1:b + 1])) for b in range(k, len(free) - 1, k)
                   if completed_at(engine.tokenizer.decode(free[b - 1:b + 1])) == b + 1)
    run = chunked(k, replace(plain, stop=(stop,)))
    assert run.tokens[0] == free[:b + 1] and len(run.logps[0]) == len(run.versions[0]) == b + 1
    # a stream hands the finished group out with Run's pop, and the run forgets it
    prompt, tokens, _, _, seeds = run.pop(0)
    assert (prompt, tokens, seeds) == (ids[0], [free[:b + 1]], [7]) and run.tokens[0] == []
    # a rollout server's requests in one run (``add``): each sequence its own stop strings, the run's none
    both = ChunkedRun(engine, plain)
    stopped = both.add(ids[0], plain.max_new_tokens, 7, stop=(stop,))
    free_again = both.add(ids[0], plain.max_new_tokens, 7)
    while both.live or both.queue:
        both.step(k)
    assert both.tokens[stopped] == free[:b + 1] and both.tokens[free_again] == free
