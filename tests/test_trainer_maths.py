"""The GRPO maths against hand computations, and the trainer's logprobs against a plain
full-vocabulary forward (a tiny model with a real peft LoRA)."""

from __future__ import annotations

import math

import pytest
import torch

from onjob.trainer.data import Sequence, sequence
from onjob.trainer.forward import Head, Policy, sampled_logprobs
from onjob.trainer.loop import chunk_loss
from onjob.trainer.maths import advantages, k3, k3_of_sampled, policy_loss, token_logprobs
from onjob.trainer.settings import TrainSettings


def test_advantages_are_centred_and_unscaled_by_default():
    assert advantages([1.0, 0.0, 0.5]) == pytest.approx([0.5, -0.5, 0])
    assert advantages([0.3, 0.3]) == [0.0, 0.0]
    with_std = advantages([1.0, 0.0, 0.0, 1.0], normalize_std=True)
    assert with_std == pytest.approx([1, -1, -1, 1], abs=1e-5)


def test_judge_noise_stays_a_small_advantage():
    """0.80 against 0.81 is noise: Dr. GRPO's unnormalised advantages keep it at +-0.005,
    and with std normalisation the floor keeps it at +-0.05 instead of +-1."""
    assert advantages([0.80, 0.81]) == pytest.approx([-0.005, 0.005])
    assert advantages([0.80, 0.81], normalize_std=True) == pytest.approx([-0.05, 0.05])
    assert advantages([0.80, 0.81], normalize_std=True, std_floor=0) == pytest.approx([-1, 1])


def test_a_member_outside_the_baseline_is_scored_against_it_but_does_not_move_it():
    # The logged answer (1.0, the client's temperature) against rivals at 0.2 and 0.4.
    advs = advantages([1.0, 0.2, 0.4], baseline=[False, True, True])
    assert advs == pytest.approx([0.7, -0.1, 0.1])


def test_ppo_loss_on_a_toy_batch_equals_a_hand_computation():
    logp = torch.tensor([-1.0, -0.5, -2.0, -0.1])
    old = torch.tensor([-1.0, -1.0, -1.0, -0.1])
    adv = torch.tensor([1.0, 1.0, -1.0, -2.0])
    parts = policy_loss(logp, old, adv, eps_low=0.2, eps_high=0.2)
    # ratios 1, e^0.5 = 1.6487 (clipped to 1.2 for A > 0), e^-1 = 0.3679 (clipped to 0.8,
    # and A < 0 takes the min: -0.8), 1.
    r = [1.0, math.exp(0.5), math.exp(-1.0), 1.0]
    expected = -(min(r[0], 1.0) * 1 + min(r[1], 1.2) * 1 + min(r[2] * -1, 0.8 * -1) + -2 * r[3])
    assert parts.loss.item() == pytest.approx(expected, rel=1e-6)
    assert parts.clipped == 2


def test_one_wild_token_cannot_make_the_loss_infinite_or_dominate_the_step():
    """A negative advantage and a token the sampler found near-impossible (logged logprob
    -1e4): the ratio overflows to inf without the log-ratio clamp; with dual clip the
    token's loss is capped at dual_clip x |A| and it gives no gradient."""
    logp = torch.tensor([-0.5, -0.7], requires_grad=True)
    old = torch.tensor([-1e4, -0.7])
    adv = torch.tensor([-1.0, -1.0])
    parts = policy_loss(logp, old, adv, dual_clip=3.0)
    assert math.isfinite(parts.loss.item()) and math.isfinite(parts.ratio_sum)
    assert parts.loss.item() == pytest.approx(3.0 + 1.0)
    parts.loss.backward()
    assert logp.grad.tolist() == pytest.approx([0.0, 1.0])


def test_ratio_is_one_when_the_policy_has_not_moved():
    logp = torch.tensor([-0.7, -1.3, -0.2], requires_grad=True)
    adv = torch.tensor([0.5, -1.0, 2.0])
    parts = policy_loss(logp, logp.detach().clone(), adv)
    assert parts.ratio_sum == pytest.approx(3.0) and parts.clipped == 0
    assert parts.loss.item() == pytest.approx(-adv.sum().item())
    parts.loss.backward()
    # d/dlogp of -r·A at r = 1 is -A: a positive advantage pushes the logprob up.
    assert logp.grad.tolist() == pytest.approx((-adv).tolist())


def test_cispo_keeps_the_gradient_of_tokens_ppo_clips_away():
    old = torch.tensor([-2.0])
    adv = torch.tensor([1.0])
    for kind, expect_grad in (("ppo", False), ("cispo", True)):
        logp = torch.tensor([-1.0], requires_grad=True)  # ratio e^1 > 1.2
        policy_loss(logp, old, adv, kind=kind).loss.backward()
        assert (logp.grad.abs().item() > 0) is expect_grad, kind
    logp = torch.tensor([-1.0], requires_grad=True)
    policy_loss(logp, old, adv, kind="cispo").loss.backward()
    # The weight is the ratio (e): CISPO caps only the top, at cispo_max_weight, not at
    # PPO's 1.2, which would leave every token's weight within 0.8-1.2.
    assert logp.grad.item() == pytest.approx(-math.e, rel=1e-6)


def test_cispo_caps_a_tokens_weight_at_the_top_only():
    adv = torch.tensor([1.0, 1.0])
    logp = torch.tensor([0.0, -3.0], requires_grad=True)
    old = torch.tensor([-3.0, 0.0])  # ratios e^3 ~ 20 (capped) and e^-3 ~ 0.05 (kept)
    parts = policy_loss(logp, old, adv, kind="cispo", cispo_max_weight=5.0)
    parts.loss.backward()
    assert logp.grad.tolist() == pytest.approx([-5.0, -math.exp(-3.0)], rel=1e-5)
    assert parts.clipped == 1


def test_k3_kl_is_zero_at_the_reference_and_positive_away_from_it():
    logp = torch.tensor([-1.0, -1.0])
    adv = torch.zeros(2)
    at_ref = policy_loss(logp, logp, adv, ref_logp=logp, beta=0.1)
    assert at_ref.kl_sum == pytest.approx(0.0)
    away = policy_loss(logp, logp, adv, ref_logp=torch.tensor([-0.5, -2.0]), beta=0.1)
    d = [0.5, -1.0]
    assert away.kl_sum == pytest.approx(sum(math.exp(x) - x - 1 for x in d))
    assert away.loss.item() == pytest.approx(0.1 * away.kl_sum)


def test_kl_on_another_samplers_tokens_stays_bounded_when_the_policy_drops_one():
    """The sampler (here the reference) chose three tokens; the policy learned to avoid the
    third. Unweighted, that token's k3 is e^20: the estimate says the policy left the
    reference entirely. Weighted by policy / sampler, it counts as rarely as the policy
    would now sample it, and the estimate is the k3 of the tokens the policy keeps."""
    ref = torch.tensor([-0.5, -1.0, -2.0])
    logp = torch.tensor([-0.4, -1.1, -40.0])
    plain = k3(logp, ref).mean().item()
    total, weight = k3_of_sampled(logp, ref, sampler_logp=ref)
    assert plain > 1e7
    kept = k3(logp[:2], ref[:2])
    w = torch.exp(logp[:2] - ref[:2])
    assert total / weight == pytest.approx(((w * kept).sum() / w.sum()).item(), rel=1e-4)
    assert total / weight < 0.01
    # A token the policy now favours weighs at most MAX_KL_WEIGHT times.
    total, weight = k3_of_sampled(torch.tensor([-0.01]), torch.tensor([-9.0]), torch.tensor([-9.0]))
    assert weight == pytest.approx(5.0)


def test_token_logprobs_match_a_full_log_softmax():
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 500, bias=False)
    hidden = torch.randn(37, 16)
    targets = torch.randint(0, 500, (37,))
    full = torch.log_softmax(head(hidden), -1).gather(-1, targets[:, None]).squeeze(-1)
    assert torch.allclose(token_logprobs(hidden, head, targets, chunk=8), full, atol=1e-5)


def test_the_head_keeps_no_vocabulary_sized_logits_for_backward():
    """Each chunk of the head is recomputed in backward: what autograd keeps for 512 rows of
    a 5,000-token vocabulary is far below the 512 x 5,000 fp32 logits (10 MB)."""
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 5000, bias=False)
    hidden = torch.randn(512, 16, requires_grad=True)
    targets = torch.randint(0, 5000, (512,))
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logp = token_logprobs(hidden, lambda h: head(h).float(), targets, chunk=64)
    assert sum(saved) < 512 * 5000 * 4 / 10
    logp.sum().backward()  # and the gradient is still there
    full = torch.log_softmax(head(hidden), -1).gather(-1, targets[:, None]).sum()
    (expected,) = torch.autograd.grad(full, hidden)
    assert torch.allclose(hidden.grad, expected, atol=1e-5)


def tiny_lora(**overrides):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        **overrides,
    )
    lora = LoraConfig(r=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    return get_peft_model(LlamaForCausalLM(config), lora)


def members(prompt_len: int = 20, lengths=(5, 8, 3)) -> list[Sequence]:
    prompt = list(range(10, 10 + prompt_len))
    out = []
    for i, n in enumerate(lengths):
        tokens = prompt + [100 + 7 * i + j for j in range(n)]
        mask = [False] * prompt_len + [True] * n
        advantage = 1.0 if i == 0 else -0.5
        out.append(Sequence(f"m{i}", tokens, mask, [0.0] * len(tokens), advantage, 1.0 - i))
    return out


def naive_logprobs(model, seqs: list[Sequence]) -> torch.Tensor:
    out = []
    for s in seqs:
        ids = torch.tensor([s.tokens])
        logits = model(input_ids=ids).logits[0, :-1]
        lp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
        out += [lp[t - 1] for t in range(1, len(s.tokens)) if s.loss_mask[t]]
    return torch.stack(out)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_members_sharing_a_prompt_get_the_logprobs_of_separate_full_forwards(attention):
    """Eager attention adds the mask to the scores: a boolean mask (True -> +1.0) masked
    nothing there, and every member saw the others."""
    model = tiny_lora(attn_implementation=attention)
    head = Head.of(model.get_base_model())
    seqs = members()
    shared = sampled_logprobs(model, head, seqs, "cpu", share_prefix=True)
    separate = sampled_logprobs(model, head, seqs, "cpu", share_prefix=False)
    reference = naive_logprobs(model, seqs)
    assert shared.shape == (16,)
    assert torch.allclose(shared, reference, atol=1e-5)
    assert torch.allclose(separate, reference, atol=1e-5)


def test_masked_tokens_get_zero_gradient():
    """Only the states that predict a sampled token get a gradient from the loss: the
    prompt's positions (and padding) get none."""
    model = tiny_lora()
    seqs = members(prompt_len=6, lengths=(4, 2))
    with torch.no_grad():  # the sampler's logprobs = the policy's: no token is clipped
        current = iter(naive_logprobs(model, seqs).tolist())
    for s in seqs:
        s.old_logprobs = [next(current) if keep else 0.0 for keep in s.loss_mask]
    grads = []
    norm = model.get_base_model().model.norm

    def keep(module, args, output):
        output.retain_grad()
        grads.append(output)

    handle = norm.register_forward_hook(keep)
    policy = Policy(model, Head.of(model.get_base_model()), 4096, "cpu")
    parts = chunk_loss(policy, seqs, TrainSettings())
    parts.loss.backward()
    handle.remove()
    has_grad = (grads[0].grad[0].abs().sum(-1) > 0).tolist()
    # Packed: the shared 6-token prompt (0-5), member 0's 4 answer tokens (6-9), member 1's
    # 2 (10-11). A state has a gradient iff it predicts an answer token: the prompt's last
    # (each member's first answer token) and every answer token but each member's last.
    assert [i for i, g in enumerate(has_grad) if g] == [5, 6, 7, 8, 10]


def test_earlier_answers_of_a_conversation_are_found_and_trained_later_turns_masked():
    prompts = [[1, 2, 3], [1, 2, 3, 10, 11, 4, 5], [1, 2, 3, 99, 4, 5, 6]]
    completions = [[10, 11], [20], [30, 31]]
    logprobs = [[-0.1, -0.2], [-0.3], [-0.4, -0.5]]
    tokens, mask, old, unaligned = sequence(prompts[:2], completions[:2], logprobs[:2])
    assert tokens == [1, 2, 3, 10, 11, 4, 5, 20]
    assert mask == [False, False, False, True, True, False, False, True]
    assert old == [0, 0, 0, -0.1, -0.2, 0, 0, -0.3] and unaligned == 0
    # A turn the final prompt does not contain as sampled stays masked, and is counted.
    tokens, mask, _, unaligned = sequence(
        [prompts[0], prompts[2]], [completions[0], completions[2]], [logprobs[0], logprobs[2]]
    )
    assert unaligned == 1 and sum(mask) == 2
