"""Multimodal tasks (MMMU, DocVQA): preprocessors, metrics and image handling."""
