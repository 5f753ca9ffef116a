"""What generation may be asked for is bounded per family, and beam search's memory grows with what it generates,
not with what max_new_tokens allows: T5's relative positions decode at most RELATIVE_DECODE_LIMIT positions, a
learned table its own length; a beam search that ends after a few steps allocates the same whether 5 or 2,000 new
tokens were allowed, and gives the same tokens."""

from __future__ import annotations

import pytest
import torch
from transformer_helpers import gpt2_pair, t5_pair

from bertology import generate
from bertology.errors import ConfigError
from bertology.generation import RELATIVE_DECODE_LIMIT, decode_limit

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def t5():
    torch.manual_seed(0)
    return t5_pair()[1]


def allocated_bytes(run) -> tuple[torch.Tensor, int]:
    """What `run()` returns and the bytes the CPU allocator handed out while it ran (every allocation summed)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, profile_memory=True) as profile:
        out = run()
    return out, sum(event.cpu_memory_usage for event in profile.events() if event.cpu_memory_usage > 0)


def test_beam_search_allocates_for_what_it_generates_not_for_what_is_allowed(t5):
    torch.manual_seed(1)
    ids = torch.randint(3, 40, (2, 6))
    # Every id but the pad ends a hypothesis: the beams finish at once, whatever the allowance.
    options = dict(num_beams=4, eos_token_id=list(range(1, 40)), early_stopping=True)
    short, short_bytes = allocated_bytes(lambda: generate(t5, ids, max_new_tokens=5, **options))
    long, long_bytes = allocated_bytes(lambda: generate(t5, ids, max_new_tokens=2000, **options))
    assert short.shape[1] < 6 and torch.equal(short, long)
    # Preallocating batch x beams x 2000 tokens (as the finished hypotheses once were) made this 48 MB against 1 MB.
    assert long_bytes <= 1.05 * short_bytes, (short_bytes, long_bytes)


def test_relative_positions_decode_at_most_the_documented_limit(t5):
    assert decode_limit(t5.config) == (RELATIVE_DECODE_LIMIT, "the generation limit of relative positions:")
    ids = torch.randint(3, 40, (1, 4))
    forwards = []  # every module's forward while the refused call runs: refused before anything runs
    hook = torch.nn.modules.module.register_module_forward_pre_hook(lambda module, args: forwards.append(module))
    try:
        with pytest.raises(ConfigError, match=rf"max_new_tokens: 1 start token\(s\) \+ 10000000 new tokens exceed "
                                              rf"the generation limit of relative positions: {RELATIVE_DECODE_LIMIT} "
                                              r"positions"):
            generate(t5, ids, max_new_tokens=10**7, num_beams=8)
    finally:
        hook.remove()
    assert forwards == []
    generate(t5, ids, max_new_tokens=RELATIVE_DECODE_LIMIT - 1, num_beams=2, eos_token_id=list(range(1, 40)),
             early_stopping=True)  # the limit itself is allowed


def test_a_learned_table_limits_generation_to_its_length_and_a_seed_to_64_bits():
    torch.manual_seed(0)
    gpt2 = gpt2_pair(positions=32, bos_token_id=1, eos_token_id=2, pad_token_id=0)[1]
    assert decode_limit(gpt2.config) == (32, "the model's")
    with pytest.raises(ConfigError, match=r"3 prompt token\(s\) \+ 30 new tokens exceed the model's 32 positions"):
        generate(gpt2, torch.tensor([[5, 6, 7]]), max_new_tokens=30)
    with pytest.raises(ConfigError, match=r"seed must be an integer in \[0, 2\*\*63\) or None, got "
                                          r"1180591620717411303424"):
        generate(gpt2, torch.tensor([[5, 6, 7]]), do_sample=True, seed=2**70)
