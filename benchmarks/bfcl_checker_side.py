"""BFCL's own checker on replies, run in a venv that has bfcl-eval (benchmarks/bfcl_vs_checker.py
calls it there). Reads JSON lines {key, category, function, ground_truth, text} on stdin and writes
{key, valid, error_type} lines. bfcl-eval is installed with --no-deps plus the few packages its
decoder and AST checker import (filelock, tenacity, python-dotenv, tree_sitter 0.21.3,
tree-sitter-java 0.21.0, tree-sitter-javascript 0.21.4); its model registry (which imports every
provider's SDK) is replaced by one entry for a prompting model, whose function names are not
rewritten (underscore_to_dot false), as BFCL treats its prompt models (bfcl_side_common.py)."""
from __future__ import annotations

from bfcl_side_common import MODEL, answer  # (first: it replaces BFCL's model registry)

from bfcl_eval.constants.enums import Language, ReturnFormat
from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
from bfcl_eval.model_handler.utils import default_decode_ast_prompting
from bfcl_eval.utils import is_empty_output, is_function_calling_format_output


def verdict(row: dict) -> tuple[bool, str]:
    """BFCL's verdict for one prompting-mode reply (its eval runner's steps for the AST categories
    and for irrelevance)."""
    try:
        decoded = default_decode_ast_prompting(row["text"], ReturnFormat.PYTHON)
        decoded_ok = True
    except Exception:
        decoded, decoded_ok = None, False
    if "irrelevance" in row["category"]:
        called = decoded_ok and not is_empty_output(decoded)
        return (not called), ("irrelevance_error:decoder_success" if called else "")
    if not decoded_ok:
        return False, "ast_decoder:decoder_failed"
    if not is_function_calling_format_output(decoded):
        return False, "ast_decoder:decoder_wrong_output_format"
    result = ast_checker(row["function"], decoded, row["ground_truth"], Language.PYTHON, row["category"],
                         MODEL.replace("/", "_"))
    return bool(result["valid"]), result.get("error_type", "")


answer(lambda row, n: verdict(row))
