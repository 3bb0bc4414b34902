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


def _fresh_pages_on_reallocation(make, trials: int = 40) -> int:
    """Of ``trials`` rounds -- 4 blocks of 32 MB made, freed, made again, small allocations between rounds -- how
    many took fresh pages for half of the blocks or more the second time."""
    import torch

    from core.memory import keep_freed_memory, release_freed_memory, rss_bytes

    keep_freed_memory()
    block, fresh = 32 << 20, 0
    for trial in range(trials):
        small = [torch.zeros(1000 + 7 * trial) for _ in range(50)]  # noqa: F841 -- what a process holds between
        first = [make(block) for _ in range(4)]
        before = rss_bytes()
        del first
        again = [make(block) for _ in range(4)]
        fresh += rss_bytes() - before >= 2 * block
        del again
        release_freed_memory()
    return fresh


def test_a_freed_heap_block_serves_the_next_of_its_size():
    """``heap_zeros`` (the KV cache's CPU memory): a block freed by ``sleep`` is the next ``wake``'s, every time;
    torch's aligned allocations took fresh pages for half or more of them in 2 of 20 rounds of 32 MB blocks and 11 of
    40 of 134 MB ones (measured before the KV cache moved to it)."""
    import torch

    from core.memory import heap_zeros, keep_freed_memory

    if not keep_freed_memory():
        pytest.skip("not glibc: freed blocks are the allocator's own business")
    assert _fresh_pages_on_reallocation(lambda n: heap_zeros((n // 4,), torch.float32)) == 0
    t = heap_zeros((3, 5), torch.bfloat16)
    assert t.shape == (3, 5) and t.dtype == torch.bfloat16 and t.data_ptr() % 64 == 0 and not t.any()
