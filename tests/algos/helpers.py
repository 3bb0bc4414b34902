import torch

from core.algos import scores_to_token_rewards
from core.protocol import Batch


def mask_of(lengths, T=None) -> torch.Tensor:
    lengths = torch.as_tensor(lengths)
    T = T or int(lengths.max())
    return (torch.arange(T)[None, :] < lengths[:, None]).to(torch.float64)


def outcome_batch(scores, uid=None, lengths=None, T=None, **tensors) -> Batch:
    """Outcome scores placed at each row's last valid token, float64 for exact hand-computed checks."""
    scores = torch.as_tensor(scores, dtype=torch.float64)
    mask = mask_of(lengths if lengths is not None else [1] * len(scores), T)
    b = Batch({"token_rewards": scores_to_token_rewards(scores, mask), "response_mask": mask,
               **{k: torch.as_tensor(v, dtype=torch.float64) for k, v in tensors.items()}},
              {"uid": uid if uid is not None else ["g"] * len(scores)})
    return b
