"""The step-time simulator (``core.simulate``): hand-computed step times, the invariants between modes, and the
long tail it exists to show."""

import dataclasses
import json

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
    # a KV cache of 13 tokens holds one sequence whole (10 + 3): the same as one slot
    kv = simulate(COSTS, ONE, Layout(train_gpus=1, replicas=1, kv_tokens=13), "sync", steps=5)
    assert kv.step_s == pytest.approx(one_slot.step_s)
    # two training ranks halve the training; colocated, the same 2 GPUs generate (the one group on one replica)
    two = simulate(COSTS, ONE, Layout(train_gpus=2, replicas=2, colocated=True), "sync", steps=5)
    assert two.step_s == pytest.approx(0.56 + 1.5 + 0.5) and two.tokens_per_s_per_gpu == pytest.approx(6 / 2.56 / 2)
    # a distillation teacher 4x the policy's size: 4 more forwards of the 26 tokens (26 x 4 / 26 = 4 s)
    taught = simulate(COSTS, dataclasses.replace(ONE, teacher=4.0), Layout(train_gpus=1, replicas=1), "sync", steps=5)
    assert taught.step_s == pytest.approx(0.56 + 3 + 4 + 0.5)


def test_one_step_off_hides_the_generation_behind_the_training():
    p = simulate(COSTS, ONE, Layout(train_gpus=1, replicas=1), "one_step_off", steps=5)
    assert p.step_s == pytest.approx(3 + 0.5)                             # max(gen 0.56, train 3) + sync
    with pytest.raises(ValueError, match="GPUs of its own"):
        simulate(COSTS, ONE, Layout(train_gpus=1, replicas=1, colocated=True), "one_step_off")


AGENT = Workload(prompts_per_step=1, n=2, prompt_tokens=10, lengths=(), turns=((3, 4, 2),), reference=False)
TOOLS_1S = dataclasses.replace(COSTS, tool_s=1.0)


def test_an_agent_step_by_hand_its_slot_free_while_the_tools_run():
    # both samples: prefill 2 x 10 tokens (0.2 s), 3 decode steps of 2 (0.36 s); the tools answer 1 s later with 4
    # tokens; the second turns prefill their contexts (2 x 17 tokens: 0.34 s) and decode 2 steps of 2 (0.24 s)
    # = 2.14 s; train 38 tokens (2 x 10 + 2 x (3 + 4 + 2)) x 3 / 26; sync 0.5
    p = simulate(TOOLS_1S, AGENT, Layout(train_gpus=1, replicas=1), "sync", steps=5)
    assert p.phases["gen"] == pytest.approx(2.14)
    assert p.step_s == pytest.approx(2.14 + 38 * 3 / 26 + 0.5)
    assert p.rollout_idle == pytest.approx(1 - (2.14 - 1.0) / p.step_s)   # waiting for the tools is idle
    # one slot: the second sample decodes while the first one's tools run (0.43 s each turn one, idle to 1.43,
    # 0.17 + 0.22 s, idle to 1.86, 0.39 s) = 2.25 s, not two samples one after the other (2 x 1.82 s)
    one = simulate(TOOLS_1S, AGENT, Layout(train_gpus=1, replicas=1, slots=1), "sync", steps=5)
    assert one.phases["gen"] == pytest.approx(2.25)


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
    assert off.phases["gen_wait"] > 2 * s1.phases["gen_wait"]             # the tail holds one step off, not streaming
    assert s1.train_idle < off.train_idle
    # without a tail (every sample 58 tokens, the same mean) one step off is as fast as streaming
    flat = Workload(prompts_per_step=8, n=4, prompt_tokens=50, lengths=(58,), model_gb=1.0)
    assert simulate(FAST_TRAIN, flat, layout, "one_step_off", steps=30).step_s == pytest.approx(
        simulate(FAST_TRAIN, flat, layout, "streaming", steps=30).step_s, rel=0.05)


def test_costs_from_a_data_sheet_by_hand():
    """H100 numbers for a made-up model of 1e9 parameters, 10 layers, 2 KV heads of 64: a decode step reads 2 GB of
    weights at 0.6 x 3350 GB/s, 2 x 10 x 2 x 64 x 2 = 5120 bytes of KV per context token; prefill 0.5 x 989 TFLOP/s
    over 2e9 FLOPs a token; training 0.4 x 989 over 2e9 (forward) and 8e9 (update)."""
    from core.model_shapes import ModelShape
    from core.time_plan import HARDWARE, costs_for

    shape = ModelShape(params=1e9, layers=10, hidden=128, intermediate=256, heads=2, kv_heads=2, vocab=1000)
    c = costs_for(HARDWARE["h100"], shape)
    assert c.decode_base_s == pytest.approx(2e9 / (0.6 * 3350e9))
    assert c.decode_per_ctx_s == pytest.approx(5120 / (0.6 * 3350e9))
    assert c.prefill_tok_s == pytest.approx(0.5 * 989e12 / 2e9) and c.decode_per_seq_s == pytest.approx(1 / c.prefill_tok_s)
    assert c.forward_tok_s == pytest.approx(0.4 * 989e12 / 2e9) and c.update_tok_s == pytest.approx(0.4 * 989e12 / 8e9)
    two = costs_for(HARDWARE["h100"], shape, tp=2)                 # a replica of 2 GPUs: twice the bandwidth
    assert two.decode_base_s == pytest.approx(c.decode_base_s / 2) and two.forward_tok_s == c.forward_tok_s


def test_response_lengths_from_a_spec_or_a_file(tmp_path):
    from core.config import ConfigError
    from core.time_plan import lengths_from

    got = lengths_from("lognormal:median=100,sigma=0.5", limit=150, count=2000)
    assert max(got) == 150 and 90 < sorted(got)[1000] < 110          # clipped at the limit; the median
    (tmp_path / "lengths.txt").write_text("5 7\n900\n")
    assert lengths_from(str(tmp_path / "lengths.txt"), limit=100) == (5, 7, 100)
    with pytest.raises(ConfigError, match="neither lognormal"):
        lengths_from("uniform:1,2", limit=10)


def test_hybridrl_plan_time_prints_the_three_modes_for_the_configs_placement(capsys):
    from core.cli import main

    assert main(["plan", "grpo", "--time", "h100", "--lengths", "lognormal:median=40,sigma=1",
                 "trainer.total_steps=2"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| colocated") or line.startswith("| split")]
    assert [r.split(" | ")[1] for r in rows] == ["sync", "streaming", "sync", "one_step_off", "streaming"]
    assert "step time on h100 (H100 SXM5" in out and "responses mean" in out
    assert main(["train", "grpo", "--time", "h100"]) == 2         # a prediction, not a run: one line, exit 2
    assert "--time and --lengths predict a run's step time" in capsys.readouterr().err


def test_a_run_logs_each_steps_response_lengths_which_plan_time_reads(tmp_path, tiny_model_dir):
    from core.time_plan import lengths_from, run_prompt_tokens
    from tests.test_checkpoint import fit_run, write_run

    conf = write_run(tmp_path, tiny_model_dir, total_steps=2, save_freq=0)
    metrics = fit_run(conf, tmp_path / "run")
    rows = [json.loads(line) for line in (tmp_path / "run" / "lengths.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(len(r["response_lengths"]) == 8 for r in rows)  # 2 x n=4
    assert [sum(r["response_lengths"]) / 8 for r in rows] == pytest.approx(
        [metrics[s]["response_length/mean"] for s in (1, 2)])
    assert lengths_from(str(tmp_path / "run"), limit=6) == tuple(x for r in rows for x in r["response_lengths"])
    # the prompts' lengths too ("a + a?" in the chat template of the tiny tokenizer: one length per sample)
    assert all(len(r["prompt_lengths"]) == 8 and min(r["prompt_lengths"]) > 0 for r in rows)
    assert run_prompt_tokens(str(tmp_path / "run")) == pytest.approx(
        sum(x for r in rows for x in r["prompt_lengths"]) / 16)
    assert run_prompt_tokens("lognormal:median=4") is None


def test_an_agent_run_logs_each_samples_turns_which_plan_time_replays(tmp_path):
    """lengths.jsonl's ``turns``: a response's runs of model and tool tokens from its masks (padding left out), and
    ``hybridrl plan --time`` reads them back as the samples it simulates."""
    from core.time_plan import run_turns
    from core.trainer import token_runs

    #            model model tool tool tool model pad
    assert token_runs([1, 1, 0, 0, 0, 1, 0], [1, 1, 1, 1, 1, 1, 0]) == [2, 3, 1]
    assert token_runs([1, 1, 0], [1, 1, 1]) == [2, 1, 0]          # a tool answer last: an empty model run after it
    assert token_runs([0, 1], [1, 1]) == [0, 1, 1] and token_runs([], []) == [0]
    import torch

    from core.protocol import Batch
    from core.trainer import log_lengths

    # a batch of two agent samples, prompts of 2 tokens (one left-padded), responses of 5 columns
    batch = Batch({"prompts": torch.zeros(2, 2, dtype=torch.long), "num_turns": torch.tensor([2.0, 1.0]),
                   "attention_mask": torch.tensor([[1, 1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 0, 0]]),
                   "response_mask": torch.tensor([[1.0, 0, 0, 1, 1], [1, 1, 1, 0, 0]])})
    log_lengths(tmp_path / "lengths.jsonl", 1, batch, fresh=True)
    (row,) = map(json.loads, (tmp_path / "lengths.jsonl").read_text().splitlines())
    assert row == {"step": 1, "response_lengths": [3, 3], "prompt_lengths": [2, 1], "turns": [[1, 2, 2], [3]]}
    with (tmp_path / "lengths.jsonl").open("a") as f:
        f.write(json.dumps({"step": 2, "turns": [[5]]}) + "\n")
    assert run_turns(str(tmp_path)) == ((1, 2, 2), (3,), (5,)) and run_turns("lognormal:median=3") == ()
