"""How much of the encoder's gradient in a training step the policy's losses make, at a checkpoint of a learned run:
the gradient on the embedding and the encoder from the language model's losses alone (the policy's weights set to
0), from the policy loss, and from the target-rate loss, each step's boundaries drawn from the same seed, one draw
per sequence centred on the batch mean (the checkpoints are past a two-draw start), on the run's first four
training batches.

    python encoder_gradient.py CHECKPOINT_OR_RUN_DIR > encoder_gradient.txt
"""
import sys
from pathlib import Path

import torch

from learntok.data.loader import make_data
from learntok.train.accumulate import accumulate_gradients
from learntok.train.checkpoint import load_model


def encoder_gradient(model, batch, lambda_policy: float, lambda_target: float, seed: int) -> torch.Tensor:
    params = [p for n, p in model.named_parameters() if n.startswith(("embed.", "encoder."))]
    options = model.boundaries.options
    kept = options.lambda_policy, options.lambda_target
    options.lambda_policy, options.lambda_target = lambda_policy, lambda_target
    try:
        model.zero_grad(set_to_none=True)
        accumulate_gradients(model, batch, 1, generator=torch.Generator().manual_seed(seed))
    finally:
        options.lambda_policy, options.lambda_target = kept
    return torch.cat([p.grad.flatten() for p in params])


if __name__ == "__main__":
    torch.set_num_threads(1)
    model, cfg = load_model(Path(sys.argv[1]))
    model.train()
    model.boundaries.grouping = False  # one draw per sequence, as past a two-draw start (group_until_bytes)
    o = model.boundaries.options
    print(f"{sys.argv[1]}: gradient norms on the embedding and encoder (lambda_policy {o.lambda_policy}, "
          f"lambda_target {o.lambda_target})")
    for i, batch in zip(range(4), make_data(cfg).train):
        lm = encoder_gradient(model, batch, 0.0, 0.0, i)
        policy = encoder_gradient(model, batch, o.lambda_policy, 0.0, i) - lm
        target = encoder_gradient(model, batch, o.lambda_policy, o.lambda_target, i) - lm - policy
        cos = torch.nn.functional.cosine_similarity(lm, policy, dim=0)
        print(f"batch {i}: language model {lm.norm():.4f}, policy loss {policy.norm():.5f}, "
              f"target-rate loss {target.norm():.5f} (policy / language model {policy.norm() / lm.norm():.5f}, "
              f"cosine {cos:+.3f})")
