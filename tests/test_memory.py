"""core.memory's allocator setting (page faults of big temporaries) and one_rank's gradient fold (bit for bit)."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from core.train.one_rank import FOLD_CHUNK, add_into

FAULTS = """
import resource, torch
from core.memory import keep_freed_memory
print(keep_freed_memory(), end=" ")
faults = []
for _ in range(20):                  # a training loop's big temporary: 64 MB, past glibc's 32 MB mmap bound
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x = torch.ones(16 << 20)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    del x
print(sum(faults[-5:]))
"""


@pytest.mark.parametrize("setting", ["1", "0"])
def test_a_freed_big_tensor_is_reused_without_page_faults(setting):
    """glibc's default maps every 64 MB block afresh: 16,384 pages faulted in each time. Kept in the heap, the
    blocks are reused once the heap has settled (glibc's aligned allocations leave a few holes first)."""
    env = {"HYBRIDRL_CPU_MALLOC": setting, "PATH": "", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", FAULTS], capture_output=True, text=True, env=env, check=True,
                         cwd=str(Path(__file__).parents[1])).stdout.split()
    applied, last_five = out[0] == "True", int(out[1])
    if setting == "1":
        assert applied and last_five < 1000
    else:
        assert not applied and last_five > 5 * 10_000


@pytest.mark.parametrize("n", [7, FOLD_CHUNK, 3 * FOLD_CHUNK + 5])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_add_into_is_the_mixed_dtype_add_bit_for_bit(n, dtype):
    g = torch.Generator().manual_seed(n)
    acc, grad = torch.randn(n, generator=g), torch.randn(n, generator=g).to(dtype)
    want = acc.clone()
    want += grad
    add_into(acc, grad)
    assert torch.equal(acc, want)
