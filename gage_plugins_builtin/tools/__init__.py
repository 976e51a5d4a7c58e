"""Tool calling: the call shape Sample v1 records, the parsers that read calls out of a model's
text, the prompt-based mode for models without native tools, and BFCL's single-turn tasks."""
