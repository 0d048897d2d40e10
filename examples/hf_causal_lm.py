"""A transformers MoE causal LM under ``torch.compile(backend="moe")``: greedy generation and a training step, the
same numbers as eager, and the speed of each against eager and inductor, measured in this run.

    .venv/bin/python examples/hf_causal_lm.py                      # Qwen3-MoE, every section
    .venv/bin/python examples/hf_causal_lm.py --model deepseek_v3  # DeepSeek-V3's grouped, biased router
    .venv/bin/python examples/hf_causal_lm.py --check              # sections 1-2 only (python/tests/test_examples.py)

The model is transformers' own class with a small random configuration (nothing is downloaded): hidden 256, two
layers, 32 experts. The only change to a user's code is the ``backend="moe"`` of ``torch.compile``: the routing of
each MoE block is raised to ``torch.ops.moe.*`` (one fused kernel a router, forward and backward: section 1 lists
them); the rest of the model, its experts included, is inductor's.

Public API only: ``import moe_mlir`` (it registers the backend), ``torch.compile``, transformers.
"""

from __future__ import annotations

import argparse
import os
from typing import Callable

import torch
import transformers

import moe_mlir
from moe_mlir.profiling import interleaved_times, ops_run

VOCAB = 1024


def build(name: str) -> transformers.PreTrainedModel:
    """A small causal LM of transformers' ``name`` family with random weights (seeded)."""
    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512)
    if name == "qwen3_moe":
        cfg = transformers.Qwen3MoeConfig(**common, intermediate_size=512, moe_intermediate_size=128,
                                          num_experts=32, num_experts_per_tok=4, norm_topk_prob=True,
                                          head_dim=64)
        model = transformers.Qwen3MoeForCausalLM(cfg)
    elif name == "deepseek_v3":
        cfg = transformers.DeepseekV3Config(**dict(common, num_key_value_heads=4), intermediate_size=512, moe_intermediate_size=128,
                                            n_routed_experts=32, num_experts_per_tok=4, n_group=4, topk_group=2,
                                            n_shared_experts=1, first_k_dense_replace=0, kv_lora_rank=64,
                                            q_lora_rank=None, qk_rope_head_dim=16, qk_nope_head_dim=32,
                                            v_head_dim=32, routed_scaling_factor=2.5)
        model = transformers.DeepseekV3ForCausalLM(cfg)
        with torch.no_grad():  # a trained model's correction bias, not zeros: the biased choice is exercised
            for m in model.modules():
                if hasattr(m, "e_score_correction_bias"):
                    m.e_score_correction_bias.copy_(torch.randn_like(m.e_score_correction_bias) * 0.1)
    elif name == "mixtral":
        cfg = transformers.MixtralConfig(**common, intermediate_size=256, num_local_experts=32,
                                         num_experts_per_tok=2)
        model = transformers.MixtralForCausalLM(cfg)
    else:
        raise ValueError(f"unknown model {name!r}: choose qwen3_moe, deepseek_v3 or mixtral")
    return model.eval()


def generator(model, forward: Callable, prompt: torch.Tensor, new_tokens: int) -> Callable[[], torch.Tensor]:
    """Greedy ``generate`` with ``forward`` as the model's forward (HF's way to compile generation)."""
    def run():
        model.forward = forward
        try:
            with torch.no_grad():
                return model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                      do_sample=False, pad_token_id=0)
        finally:
            del model.forward  # the class's forward again
    return run


def train_step(model, forward: Callable, ids: torch.Tensor, lr: float = 1e-3) -> Callable[[], float]:
    """One step: forward with labels (the load-balancing loss included), backward, SGD; returns the loss."""
    def run():
        model.zero_grad(set_to_none=True)
        loss = forward(input_ids=ids, labels=ids, output_router_logits=True).loss
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p.add_(p.grad, alpha=-lr)
        return loss.item()
    return run


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3_moe", choices=("qwen3_moe", "deepseek_v3", "mixtral"))
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--check", action="store_true", help="no timing: sections 1-2")
    args = ap.parse_args(argv)
    print(f"MoE-MLIR {moe_mlir.__version__}, PyTorch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f}")
    model = build(args.model)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(1, VOCAB, (1, 32), generator=g)
    batch = torch.randint(1, VOCAB, (4, 128), generator=g)
    eager = model.forward
    moe = torch.compile(model.forward, backend="moe")

    # 1. Generation: the same tokens as eager, and what the compiled model runs of torch.ops.moe.
    want = generator(model, eager, prompt, args.new_tokens)()
    got = generator(model, moe, prompt, args.new_tokens)()
    assert torch.equal(got, want), "generated tokens differ from eager's"
    ops = ops_run(generator(model, moe, prompt, 2))
    print(f"\n## 1. Greedy generation of {args.new_tokens} tokens from a 32-token prompt: the same tokens as eager")
    print("torch.ops.moe ops in one compiled generation of 2 tokens: "
          + ", ".join(f"{n} x{c}" for n, c in sorted(ops.items())))
    assert ops, "no torch.ops.moe op ran: the routing was not raised"

    # 2. A training step from the same weights: the same loss and gradients as eager.
    state = {k: v.clone() for k, v in model.state_dict().items()}
    model.train()
    losses, grads = {}, {}
    for name, fwd in (("eager", eager), ("moe", moe)):
        model.load_state_dict(state)
        model.zero_grad(set_to_none=True)
        loss = fwd(input_ids=batch, labels=batch, output_router_logits=True).loss
        loss.backward()
        losses[name] = loss.item()
        grads[name] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert grads["moe"].keys() == grads["eager"].keys()
    worst = max(float((grads["moe"][n] - grads["eager"][n]).abs().max() / (grads["eager"][n].abs().max() + 1e-12))
                for n in grads["eager"])
    print(f"\n## 2. A training step (4 x 128 tokens, load-balancing loss included): loss {losses['moe']:.6f} "
          f"(eager {losses['eager']:.6f}); largest gradient difference, relative to the tensor's largest entry: "
          f"{worst:.1e}")
    assert abs(losses["moe"] - losses["eager"]) <= 1e-4 * abs(losses["eager"]), losses
    assert worst <= 1e-3, worst
    model.load_state_dict(state)
    if args.check:
        return {"ops": ops, "losses": losses, "grad_rel": worst}

    # 3. Speed against eager and inductor, in this run.
    inductor = torch.compile(model.forward)
    fwds = {"eager": eager, "inductor": inductor, "moe": moe}
    print(f"\n## 3. Speed (fastest / median of {args.rounds} interleaved rounds, ms; load average "
          f"{os.getloadavg()[0]:.1f}; the first call of each, its compile, not counted)\n")
    print("| phase | eager | inductor | moe | x eager | x inductor |\n|---|---|---|---|---|---|")
    model.eval()
    rows = {"generate 16 tokens": {b: generator(model, f, prompt, args.new_tokens) for b, f in fwds.items()}}
    model.train()
    rows["training step"] = {b: train_step(model, f, batch) for b, f in fwds.items()}
    for phase, fns in rows.items():
        ms = interleaved_times(fns, args.rounds)
        cell = {b: f"{ms[b][0]:.1f} / {ms[b][1]:.1f}" for b in ms}
        print(f"| {phase} | {cell['eager']} | {cell['inductor']} | {cell['moe']} | "
              f"{ms['eager'][0] / ms['moe'][0]:.2f}x | {ms['inductor'][0] / ms['moe'][0]:.2f}x |")
    print(f"\nload average after: {os.getloadavg()[0]:.1f}")
    return {"ops": ops, "losses": losses, "grad_rel": worst}


if __name__ == "__main__":
    main()
