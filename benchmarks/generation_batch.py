"""Batched generation throughput of the transformers backend: batch 8 against batch 1.

    HF_HUB_OFFLINE=1 python benchmarks/generation_batch.py [--n 64] [--max-new-tokens 32] [--warm] [--static]

Loads the bundled SmolLM2-135M-Instruct once, generates greedily (chat template) for the
same N prompts at batch size 1 and at batch size 8, and prints tokens per second for both,
the speed-up, and whether the greedy texts agree. The backend's default path is continuous
batching (gage_plugins_builtin/backends/hf_decode.py); ``--static`` also times
``model.generate`` in static batches (``continuous_batching=false``) at both sizes, so the
batch-1 baselines can be compared. Writes benchmarks/out/generation_batch.json.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from gage_eval.api.backend import GENERATE, Request

OUT = Path(__file__).resolve().parent / "out"
QUESTIONS = [
    "What is the capital of France?", "Name three primary colours.", "How many legs does a spider have?",
    "Give one tip for saving water at home.", "What is 12 times 12?", "Why is the sky blue?",
    "Write a haiku about autumn.", "What does a thermometer measure?", "Name a planet with rings.",
    "How do you boil an egg?", "What is the opposite of 'ancient'?", "Translate 'thank you' into French.",
    "What gas do plants absorb?", "Who wrote Romeo and Juliet?", "What is the freezing point of water?",
    "Suggest a name for a pet goldfish.",
    # 48 more, so that --n 64 asks 64 different questions
    "What is the largest ocean on Earth?", "How many days are in a leap year?", "What colour is a ripe banana?",
    "Name a musical instrument with strings.", "What is the boiling point of water in Celsius?",
    "Who painted the Mona Lisa?", "What is the main ingredient of guacamole?", "How many continents are there?",
    "What do bees make?", "Name a fruit that is red.", "What is the square root of 81?",
    "Which animal is known as the king of the jungle?", "What is the chemical symbol for gold?",
    "How many hours are in a day?", "What is the tallest mountain in the world?", "Name a type of cloud.",
    "What language is spoken in Brazil?", "How many sides does a hexagon have?", "What is the capital of Japan?",
    "Give a synonym for 'happy'.", "What is the smallest prime number?", "Name a mammal that can fly.",
    "What do you call a baby cat?", "Which planet is closest to the Sun?", "What is 7 plus 8?",
    "Name something you can recycle.", "What is the opposite of 'cold'?", "How many minutes are in an hour?",
    "What is the capital of Italy?", "Name a vegetable that is orange.", "Why do we need sleep?",
    "What is the freezing point of water in Fahrenheit?", "Who invented the telephone?",
    "Write a short sentence about the sea.", "What is the plural of 'mouse'?", "Name a famous bridge.",
    "What shape has three sides?", "How do plants make food?", "What is the capital of Canada?",
    "Name a bird that cannot fly.", "What is 100 divided by 4?", "Which season comes after winter?",
    "What do you use to write on a blackboard?", "Name an animal that lives in the desert.",
    "What is the hardest natural substance?", "Translate 'hello' into Spanish.", "What is a group of wolves called?",
    "Give one reason to exercise.",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=64, help="prompts (default 64: 8 rounds at batch 8)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--warm", action="store_true", help="time a second pass at each batch size")
    ap.add_argument("--static", action="store_true", help="also time model.generate in static batches")
    args = ap.parse_args()
    from gage_plugins_builtin.backends.hf import smollm2_backend

    backend = smollm2_backend()
    backend.open()
    reqs = [Request(kind=GENERATE, sample_id=str(i), chat=True, gen={"max_new_tokens": args.max_new_tokens},
                    messages=({"role": "user", "content": [{"type": "text", "text": QUESTIONS[i % len(QUESTIONS)]}]},))
            for i in range(args.n)]
    backend.run(reqs[:1])  # warm-up
    report = {"n": args.n, "max_new_tokens": args.max_new_tokens, "warm": args.warm}
    texts = {}
    modes = [("continuous", None)] + ([("static", False)] if args.static else [])
    for mode, flag in modes:
        backend._continuous = flag  # None: continuous where the model allows it; False: model.generate
        for bs in (1, args.batch):
            backend.batch_size = bs
            if args.warm:  # a first pass at this batch size, untimed (CPU kernels warm up per shape)
                backend.run(reqs)
            t0 = time.perf_counter()
            outs = backend.run(reqs)
            wall = time.perf_counter() - t0
            errors = [o.error for o in outs if o.error]
            assert not errors, errors
            tokens = sum(o.output_tokens for o in outs)
            texts[mode, bs] = [o.text for o in outs]
            key = f"batch_{bs}" if mode == "continuous" else f"static_batch_{bs}"
            report[key] = {"wall_s": round(wall, 2), "output_tokens": tokens, "tokens_per_s": round(tokens / wall, 1)}
            print(f"{mode} batch {bs}: {tokens} tokens in {wall:.1f}s = {tokens / wall:.1f} tok/s", flush=True)
    speedup = report[f"batch_{args.batch}"]["tokens_per_s"] / report["batch_1"]["tokens_per_s"]
    same = sum(a == b for a, b in zip(texts["continuous", 1], texts["continuous", args.batch]))
    report.update(speedup=round(speedup, 2), same_text=f"{same}/{args.n}")
    print(f"speed-up batch {args.batch} vs 1: {speedup:.2f}x; identical greedy texts {same}/{args.n}")
    if args.static:
        static = report[f"static_batch_{args.batch}"]["tokens_per_s"] / report["static_batch_1"]["tokens_per_s"]
        vs_generate = report[f"batch_{args.batch}"]["tokens_per_s"] / report["static_batch_1"]["tokens_per_s"]
        same_static = sum(a == b for a, b in zip(texts["continuous", 1], texts["static", 1]))
        report.update(static_speedup=round(static, 2), speedup_vs_generate_batch_1=round(vs_generate, 2),
                      same_text_as_generate=f"{same_static}/{args.n}")
        print(f"static (model.generate) batch {args.batch} vs 1: {static:.2f}x; continuous batch {args.batch} vs "
              f"model.generate batch 1: {vs_generate:.2f}x; batch-1 texts equal to model.generate's "
              f"{same_static}/{args.n}")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "generation_batch.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
