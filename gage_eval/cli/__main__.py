"""``python -m gage_eval.cli``: the same entry point as the ``gage-eval`` console script."""
from gage_eval.cli import main

main()
