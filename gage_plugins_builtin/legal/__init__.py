"""legal_eval_v1 (spec 003): the canonical legal rows as Sample v1, their metrics and PDF text."""
