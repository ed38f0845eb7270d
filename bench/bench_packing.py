"""Packed against padded scoring of one GRPO group: the work `packing.py` saves, and that it changes nothing.

    .venv/bin/python bench/bench_packing.py [--model models/SmolLM2-135M-Instruct] [--repeats 3]

One group as in the step benchmark: a 210-token prompt and 7 completions of 40 to 128 tokens (random token ids,
seed 0; the cost does not depend on which tokens). Scored two ways with the same model:
(a) padded, as TRL and the original CANOE code do: a `(7, P + C)` batch, left-padded prompts, right-padded
completions, the output head on the last C + 1 positions;
(b) packed (`completion_logprobs`): one row, the prompt once.
Prints the tokens each way, the median seconds of a no-grad forward (what the reference model does) and of a
forward + backward (what the policy does), and the largest log-probability and gradient differences.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from plumbing import runtime  # noqa: E402, F401  (sets OMP_NUM_THREADS as training does, before torch starts its pool)
import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from training import packing  # noqa: E402
from grpo_loss import completion_logprobs, token_logprobs  # noqa: E402

PROMPT_TOKENS = 210
COMPLETION_TOKENS = (128, 40, 70, 90, 55, 64, 48)


def padded_logprobs(model, prompt, completions):
    """(a) The padded layout: `(n, P + C)` with left-padded prompts and right-padded completions."""
    n, P, C = len(completions), len(prompt), max(len(c) for c in completions)
    ids = torch.zeros(n, P + C, dtype=torch.long)
    attention = torch.zeros(n, P + C, dtype=torch.long)
    for i, c in enumerate(completions):
        ids[i, :P] = torch.tensor(prompt)
        ids[i, P : P + len(c)] = torch.tensor(c)
        attention[i, : P + len(c)] = 1
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attention, position_ids=positions, logits_to_keep=C + 1).logits
    return token_logprobs(logits[:, :-1], ids[:, -C:]), ids.numel()  # (n, C)


def timed(fn, repeats: int) -> float:
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct"))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (PROMPT_TOKENS,), generator=generator).tolist()
    completions = [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in COMPLETION_TOKENS]
    packed = packing.pack([(prompt, completions)])
    mask = packed.completion_mask  # (n, C)

    def padded():
        return padded_logprobs(model, prompt, completions)[0] * mask

    def with_grad(fn):
        def run():
            model.zero_grad()
            (fn() * mask).sum().backward()
        return run

    with torch.no_grad():
        a, padded_tokens = padded_logprobs(model, prompt, completions)
        b = completion_logprobs(model, packed)
        no_grad = {name: timed(fn, args.repeats) for name, fn in
                   (("padded", padded), ("packed", lambda: completion_logprobs(model, packed)))}
    grads = {}
    for name, fn in (("padded", padded), ("packed", lambda: completion_logprobs(model, packed))):
        with_grad(fn)()
        grads[name] = {n: p.grad.clone() for n, p in model.named_parameters()}
    train = {name: timed(with_grad(fn), args.repeats) for name, fn in
             (("padded", padded), ("packed", lambda: completion_logprobs(model, packed)))}

    grad_diff = max(float((grads["padded"][n] - grads["packed"][n]).abs().max()) for n in grads["padded"])
    grad_scale = max(float(g.abs().max()) for g in grads["padded"].values())
    print(f"one group: prompt {PROMPT_TOKENS} tokens, completions {', '.join(map(str, COMPLETION_TOKENS))}; "
          f"{torch.get_num_threads()} threads; median of {args.repeats}")
    print(f"tokens through the model: padded {padded_tokens}, packed {packed.num_tokens}")
    for name in ("padded", "packed"):
        print(f"{name}: forward (no grad) {no_grad[name]:.2f} s, forward + backward {train[name]:.2f} s")
    print(f"speed-up packed/padded: forward {no_grad['padded'] / no_grad['packed']:.2f}x, "
          f"forward + backward {train['padded'] / train['packed']:.2f}x")
    print(f"max |logprob difference| {float(((a - b) * mask).abs().max()):.2e}; max |gradient difference| "
          f"{grad_diff:.2e} (largest gradient entry {grad_scale:.2e})")


if __name__ == "__main__":
    main()
