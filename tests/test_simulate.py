"""The step-time simulator (``core.simulate``): hand-computed step times, the invariants between modes, and the
long tail it exists to show."""

import pytest

from core.simulate import Costs, Layout, Workload, simulate

# a decode step of b sequences: 0.1 + 0.01 b s; prompts prefill at 100 tokens/s; training 26 forward and 13 update
# tokens/s on one rank; a sync 0.5 s
COSTS = Costs(decode_base_s=0.1, decode_per_seq_s=0.01, prefill_tok_s=100.0, forward_tok_s=26.0, update_tok_s=13.0,
              sync_base_s=0.5)
ONE = Workload(prompts_per_step=1, n=2, prompt_tokens=10, lengths=(3,), reference=False)


def test_a_synchronous_step_by_hand():
    # gen: 2 prompts prefilled (2 x 10 / 100 = 0.2 s), 3 decode steps of 2 sequences (3 x 0.12 = 0.36 s) = 0.56 s;
    # train: 26 tokens (2 x 10 + 2 x 3) x (1 / 26 + 1 / 13) = 3 s; sync 0.5 s
    p = simulate(COSTS, ONE, Layout(train_gpus=1, replicas=1), "sync", steps=5)
    assert p.step_s == pytest.approx(0.56 + 3 + 0.5)
    assert p.tokens_per_s_per_gpu == pytest.approx(6 / 4.06 / 2)          # 6 response tokens, 2 GPUs
    assert p.phases["gen"] == pytest.approx(0.56) and p.phases["train"] == pytest.approx(3.0)
    # one slot: the two samples one after the other (each prefilled, then 3 steps of 1 sequence)
    one_slot = simulate(COSTS, ONE, Layout(train_gpus=1, replicas=1, slots=1), "sync", steps=5)
    assert one_slot.step_s == pytest.approx(2 * (0.1 + 3 * 0.11) + 3 + 0.5)
    # two training ranks halve the training; colocated, the same 2 GPUs generate (the one group on one replica)
    two = simulate(COSTS, ONE, Layout(train_gpus=2, replicas=2, colocated=True), "sync", steps=5)
    assert two.step_s == pytest.approx(0.56 + 1.5 + 0.5) and two.tokens_per_s_per_gpu == pytest.approx(6 / 2.56 / 2)


def test_one_step_off_hides_the_generation_behind_the_training():
    p = simulate(COSTS, ONE, Layout(train_gpus=1, replicas=1), "one_step_off", steps=5)
    assert p.step_s == pytest.approx(3 + 0.5)                             # max(gen 0.56, train 3) + sync
    with pytest.raises(ValueError, match="GPUs of its own"):
        simulate(COSTS, ONE, Layout(train_gpus=1, replicas=1, colocated=True), "one_step_off")


TAIL = Workload(prompts_per_step=8, n=4, prompt_tokens=50, lengths=(20,) * 9 + (400,), model_gb=1.0)
FAST_TRAIN = Costs(decode_base_s=0.01, decode_per_seq_s=0.001, prefill_tok_s=1e4, forward_tok_s=1e4,
                   update_tok_s=2.5e3, sync_base_s=0.3, sync_gb_s=5.0)


@pytest.mark.parametrize("colocated", [False, True], ids=["split", "colocated"])
def test_streaming_at_staleness_0_is_the_synchronous_step(colocated):
    layout = Layout(train_gpus=2, replicas=2, colocated=colocated)
    sync = simulate(FAST_TRAIN, TAIL, layout, "sync", steps=12, seed=3)
    stream = simulate(FAST_TRAIN, TAIL, layout, "streaming", steps=12, max_staleness=0, seed=3)
    assert stream.step_s == pytest.approx(sync.step_s)


def test_with_a_long_tail_streaming_beats_one_step_off_which_beats_sync():
    """1 sample in 10 is 20 times longer: a batch's generation is its tail, decoding a few sequences at a time.
    One step off hides it behind the training only up to the training's length; streaming keeps the replicas' batches
    full and takes the first 8 groups to finish."""
    layout = Layout(train_gpus=1, replicas=2)
    sync, off, s1, s2 = (simulate(FAST_TRAIN, TAIL, layout, m, steps=30, max_staleness=s)
                         for m, s in (("sync", 1), ("one_step_off", 1), ("streaming", 1), ("streaming", 2)))
    assert sync.step_s > off.step_s > s1.step_s > s2.step_s
    assert off.step_s == pytest.approx(off.phases["train"] + off.phases["sync"] + off.phases["gen_wait"])
    assert off.phases["gen_wait"] > 1.0 > s1.phases["gen_wait"]          # the tail held one step off, not streaming
    assert s1.train_idle < off.train_idle
    # without a tail (every sample 58 tokens, the same mean) one step off is as fast as streaming
    flat = Workload(prompts_per_step=8, n=4, prompt_tokens=50, lengths=(58,), model_gb=1.0)
    assert simulate(FAST_TRAIN, flat, layout, "one_step_off", steps=30).step_s == pytest.approx(
        simulate(FAST_TRAIN, flat, layout, "streaming", steps=30).step_s, rel=0.05)
