"""Where a SmolLM2 BFCL row's time goes on the CPU (issue 27): torch's threads, llama.cpp against the
transformers backend on one multi_turn_base step, and the prefix store on the next step.

    python benchmarks/bfcl_step_time.py threads 1 2 1 2     # prefill 300 tokens + 10 decoding steps
    python benchmarks/bfcl_step_time.py llama 1              # llama.cpp (llama-cpp-python), 1 thread
    python benchmarks/bfcl_step_time.py transformers 1 store # the backend, 1 thread, step 1 then step 2
    python benchmarks/bfcl_step_time.py transformers 1 none  # the same without the prefix store

Each line printed carries the load average before and after (this machine is shared). Run each
case in a process of its own (a model loaded twice in one process shares its threads). NEW=64 (the
new tokens a step, default 64) and ROW=0 (the multi_turn_base row) set the step.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import replace

NEW = int(os.environ.get("NEW", "64"))
ROW = int(os.environ.get("ROW", "0"))


def load() -> str:
    return open("/proc/loadavg").read().split()[0]


def first_request():
    """Row ROW of bfcl_multi_turn_base as a run builds it (the dry run's pieces), and its conversation."""
    from gage_eval.config.options import RunOptions
    from gage_eval.engine.taskrun import TaskRun
    from gage_eval.plugins import load_plugins
    from gage_eval.tasks.resolve import resolve_tasks
    from gage_plugins_builtin.tools.loop import Conversation

    _, registry = load_plugins()
    options = RunOptions(tasks=["bfcl_multi_turn_base"], model="smollm2", limit=ROW + 1)
    spec, failure = resolve_tasks(options, registry)[0]
    items = [item for item, _ in TaskRun(spec, registry, options, failure).items()]
    conv = Conversation(items[ROW].request)
    gen = {"max_new_tokens": NEW, "temperature": 0, "do_sample": False}
    return conv, replace(conv.next_request(), gen=gen)


def threads(counts: list[int]) -> None:
    import torch

    from gage_plugins_builtin.backends.hf import smollm2_backend

    backend = smollm2_backend()
    backend.open()
    ids = torch.randint(0, 1000, (1, 300))
    for n in counts:
        torch.set_num_threads(n)
        before = load()
        with torch.inference_mode():
            t = time.perf_counter()
            out = backend.model(input_ids=ids, use_cache=True)
            prefill = time.perf_counter() - t
            cache, t = out.past_key_values, time.perf_counter()
            for _ in range(10):
                cache = backend.model(input_ids=ids[:, :1], past_key_values=cache, use_cache=True).past_key_values
            step = (time.perf_counter() - t) / 10
        print(f"threads={n} OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'default')}: prefill 300 tokens "
              f"{prefill:.2f} s, one decoding step {step:.3f} s (load {before} -> {load()})", flush=True)


def llama(n: int) -> None:
    from llama_cpp import Llama

    from gage_eval.api import text_chat
    from gage_plugins_builtin.backends.hf import smollm2_backend
    from gage_plugins_builtin.tools import prompting

    _, req = first_request()
    backend = smollm2_backend()
    backend._load_tokenizer()
    text = backend.tokenizer.apply_chat_template(text_chat(prompting.prompted(req).messages), tokenize=False,
                                                 add_generation_prompt=True)
    llm = Llama(model_path=os.path.join(backend.pretrained, backend.gguf_file), n_ctx=8192, n_threads=n,
                n_batch=512, verbose=False)
    tokens = llm.tokenize(text.encode(), add_bos=False, special=True)
    before, t = load(), time.perf_counter()
    out = llm.create_completion(tokens, max_tokens=NEW, temperature=0.0)
    print(f"llama.cpp threads={n}: step 1, prompt {len(tokens)} tokens, {out['usage']['completion_tokens']} new: "
          f"{time.perf_counter() - t:.1f} s (load {before} -> {load()})", flush=True)


def transformers(n: int, store: bool) -> None:
    from gage_plugins_builtin.backends.hf import smollm2_backend

    conv, req = first_request()
    backend = smollm2_backend(threads=n, prefix_cache_mb=1024 if store else 0)
    backend.open()
    for step in (1, 2):
        before, t = load(), time.perf_counter()
        out = backend.run([req])[0]
        took = time.perf_counter() - t
        hits = f", prefix store: {backend.prefix_store.reused_tokens} tokens reused" if store else ""
        print(f"transformers threads={n} store={'on' if store else 'off'}: step {step}, prompt {out.input_tokens} "
              f"tokens, {out.output_tokens} new: {took:.1f} s (load {before} -> {load()}){hits}", flush=True)
        conv.take(out)  # its calls run, or the next user turn follows
        req = replace(conv.next_request(), gen=req.gen)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("threads", "llama", "transformers"):
        print(__doc__, file=sys.stderr)
        return 2
    if argv[0] == "threads":
        threads([int(a) for a in argv[1:]] or [1, 2])
    elif argv[0] == "llama":
        llama(int(argv[1]) if len(argv) > 1 else 1)
    else:
        transformers(int(argv[1]) if len(argv) > 1 else 1, (argv[2] if len(argv) > 2 else "store") == "store")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
