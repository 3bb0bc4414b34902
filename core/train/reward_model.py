"""Model-based rewards: a reward model scores (prompt, response) pairs, and Bradley-Terry trains one.

A reward model here is a sequence-classification model with one output (``AutoModelForSequenceClassification``,
``num_labels=1``: a causal LM's backbone and a ``score`` head), as verl, TRL and OpenRLHF load them. transformers
reads its score at each row's rightmost token that is not the pad token, so rows are **left**-padded: that token
is the last column, for every row, and a batch scores what each text alone would (a test checks it against a
direct forward). A text whose last token is the pad token itself (pad = EOS) is read one token earlier, by
transformers' rule, batched or not.

Inputs: the policy's token ids when the reward model shares its tokenizer and chat template, else the text again
through the reward model's own tokenizer and chat template (``conversation_ids``: the prompt with the generation
prompt, the response's tokens, EOS when it ended with one) -- the same encoding ``core.rm_train`` trains on.

``RewardModelWorker`` is the role (``use_reward_model``; FSDP2, colocated or on its own pool); ``core.loop.score``
weighs its scores with the reward function's; ``core.planner`` counts it; ``core.rm_train`` trains one;
recipes/ppo runs HybridFlow's four-model PPO with it (``demo_cpu_rm.yaml``, ``qwen2_7b_rm.yaml``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from core.protocol import Batch


def load_reward_model(name_or_path: str, dtype: torch.dtype = torch.float32):
    """The reward model (a 1-output sequence classifier), in eval mode. A causal-LM checkpoint gets a new random
    ``score`` head (transformers' init): the start of reward-model training."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from core.models import resolve_model

    path = resolve_model(name_or_path)
    config = AutoConfig.from_pretrained(path, num_labels=1)
    return AutoModelForSequenceClassification.from_pretrained(path, config=config, dtype=dtype).eval()


def same_tokenization(policy_tokenizer, rm_tokenizer) -> bool:
    """Can the policy's token ids go to the reward model as they are: the same vocabulary and chat template?"""
    return (policy_tokenizer.get_vocab() == rm_tokenizer.get_vocab()
            and getattr(policy_tokenizer, "chat_template", None) == getattr(rm_tokenizer, "chat_template", None))


def rm_token_ids(prompt_ids: list[list[int]], response_ids: list[list[int]], prompts: list[list[dict]],
                 policy_tokenizer, rm_tokenizer) -> list[list[int]]:
    """Each sample's reward-model input ids: prompt + response ids as they are when the tokenizations agree, else
    the prompt's messages and the decoded response (special tokens dropped) as a conversation in the reward model's
    chat template. ``prompt_ids`` / ``response_ids``: the valid ids only (no padding); ``prompts``: chat lists."""
    if same_tokenization(policy_tokenizer, rm_tokenizer):
        return [list(p) + list(r) for p, r in zip(prompt_ids, response_ids)]
    texts = policy_tokenizer.batch_decode(response_ids, skip_special_tokens=True)
    ended = [bool(r) and r[-1] == policy_tokenizer.eos_token_id for r in response_ids]
    return [conversation_ids(rm_tokenizer, messages, text, end) for messages, text, end in zip(prompts, texts, ended)]


def conversation_ids(tokenizer, messages: list[dict], answer: str, ended: bool = True) -> list[int]:
    """A (prompt, answer) pair as the policy produces it, in ``tokenizer``'s terms: the prompt through the chat
    template with the generation prompt, the answer's tokens, and EOS when the answer ended with one -- so that a
    reward model reads its score at the same token whether it was fed the policy's ids, re-tokenised text, or
    trained on preference pairs (``core.rm_train``)."""
    if getattr(tokenizer, "chat_template", None):
        prompt = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                    return_dict=False))
    else:
        prompt = tokenizer(messages[-1]["content"], add_special_tokens=True)["input_ids"]
    eos = [tokenizer.eos_token_id] if ended and tokenizer.eos_token_id is not None else []
    return prompt + tokenizer(answer, add_special_tokens=False)["input_ids"] + eos


def left_padded(seqs: list[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """``input_ids``, ``attention_mask``, ``position_ids`` (B, longest) of sequences padded on the left."""
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
        mask[i, width - len(s):] = 1
    return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}


def token_budget_batches(seqs: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Row indices in batches of at most ``max_tokens`` padded tokens (a longer row alone), rows sorted by length so
    that a batch pads little."""
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    batches, start = [], 0
    while start < len(order):
        end = start + 1
        while end < len(order) and (end + 1 - start) * len(seqs[order[end]]) <= max_tokens:
            end += 1
        batches.append(order[start:end])
        start = end
    return batches


def batch_scores(model, seqs: list[list[int]], pad_id: int, device) -> torch.Tensor:
    """One left-padded forward: the scores (B,) in fp32 on ``device`` (with grad where autograd is on: training)."""
    inputs = {k: v.to(device) for k, v in left_padded(seqs, pad_id).items()}
    return model(**inputs).logits[:, 0].float()


@torch.no_grad()
def sequence_scores(model, seqs: list[list[int]], pad_id: int, max_tokens: int = 8192) -> torch.Tensor:
    """The reward model's score of each sequence (B,) in fp32, in ``token_budget_batches``, each left-padded."""
    scores = torch.empty(len(seqs))
    device = next(model.parameters()).device
    for rows in token_budget_batches(seqs, max_tokens):
        scores[rows] = batch_scores(model, [seqs[i] for i in rows], pad_id, device).cpu()
    return scores


class RewardModelWorker:
    """A reward model as a worker role: FSDP2 over the role's ranks in its compute dtype (no fp32 master: it is
    never trained here), scoring its share of a batch in token-budget forwards, as many on every rank."""

    def __init__(self, ctx, cfg, policy_model: str):
        """``cfg``: ``core.config.RewardModelConfig``; ``policy_model``: whose tokenizer wrote the batch's ids."""
        from core.train.sharding import IdleOffload, shard
        from core.models import load_tokenizer, resolve_dtype

        self.ctx, self.cfg = ctx, cfg
        torch.manual_seed(cfg.seed)  # a new score head is drawn alike on every rank
        compute = resolve_dtype(cfg.dtype, ctx.device)
        model = load_reward_model(cfg.model, dtype=compute)
        self.model = shard(model.to(ctx.device if cfg.offload != "full" else "cpu"), ctx, compute, cfg.offload,
                           "reward_model")
        self.idle = IdleOffload(self.model, None, ctx.device, cfg.offload == "idle")
        self.policy_tok, self.rm_tok = load_tokenizer(policy_model), load_tokenizer(cfg.model)
        pad = self.rm_tok.pad_token_id
        self.pad_id = pad if pad is not None else self.rm_tok.eos_token_id
        # transformers reads the score at the rightmost token that is not config.pad_token_id, and refuses a batch
        # when the config has none (many causal-LM checkpoints): the padding this role uses
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.pad_id

    @torch.no_grad()
    def compute_rm_scores(self, batch: Batch) -> Batch:
        """``rm_scores`` (B,): the reward model's score of each row's prompt and valid response tokens. Keys:
        input_ids, attention_mask, responses, response_mask; ``prompt`` (chat lists) when re-tokenising."""
        from core.train.micro_batches import equalise_passes

        batch.require("input_ids", "attention_mask", "responses", "response_mask")
        Tp = batch["input_ids"].shape[1] - batch["responses"].shape[1]
        prompt_ids = [ids[m > 0].tolist() for ids, m in zip(batch["input_ids"][:, :Tp], batch["attention_mask"][:, :Tp])]
        response_ids = [r[m > 0].tolist() for r, m in zip(batch["responses"], batch["response_mask"])]
        prompts = list(batch["prompt"]) if "prompt" in batch else None
        if prompts is None and not same_tokenization(self.policy_tok, self.rm_tok):
            raise ValueError(f"rank {self.ctx.rank}: the reward model {self.cfg.model!r} tokenises otherwise than the "
                             "policy, so it needs the rows' chat messages (key 'prompt') to re-tokenise them")
        seqs = rm_token_ids(prompt_ids, response_ids, prompts, self.policy_tok, self.rm_tok)
        scores = torch.empty(len(seqs))
        self.model.eval()
        with self.idle.on_gpu():
            # equal forwards on every rank (FSDP all-gathers); a padding pass scores row 0 again, unused
            for rows in equalise_passes(token_budget_batches(seqs, self.cfg.max_tokens_per_micro), self.ctx.device):
                got = batch_scores(self.model, [seqs[i] for i in (rows or [0])], self.pad_id, self.ctx.device).cpu()
                if rows is not None:
                    scores[rows] = got
        return Batch({"rm_scores": scores})


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Reward-model training on preference pairs: L = -mean log sigmoid(r_chosen - r_rejected), and the pair
    accuracy mean(r_chosen > r_rejected) (ties count as wrong). Shapes (P,) -> scalars.
    Paper: Bradley & Terry 1952; for reward models, Ouyang et al. 2022 (arXiv:2203.02155), Eq. 1.
    Example: chosen [2, 0], rejected [1, 1] -> L = (log(1 + e^-1) + log(1 + e^1)) / 2 = 0.8133, accuracy 0.5."""
    margin = chosen.float() - rejected.float()
    return -F.logsigmoid(margin).mean(), (margin > 0).float().mean()
