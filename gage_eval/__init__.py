"""gage-eval: an evaluation harness built on pluggy plugins and task folders."""
from gage_eval.hookspecs import hookimpl

__version__ = "0.1.0"
__all__ = ["hookimpl", "__version__"]
