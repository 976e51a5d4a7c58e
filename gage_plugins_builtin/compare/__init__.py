"""``gage-eval compare RUN_A RUN_B``, a feature of the builtin plugin: a paired comparison of two
run folders (``paired``), shown on the console or as a page (``show``); the command is ``command``.

Per task present in both runs, the samples (``samples/<task>.jsonl``, the record of truth)
are aligned by sample id. Rows that errored on either side are counted and left out of the
paired statistics. Per metric present in both runs' summary.json for the task:

* the mean of A and of B over the paired ids, and the difference B - A;
* a seeded paired bootstrap 95% interval of the difference: the paired ids, in natural
  order (piqa-2 before piqa-10), are resampled with replacement ``--samples`` times
  (default 1000) by ``random.Random(seed)`` (default 1234), index ``int(rng.random() * n)``
  drawn n times per resample, the same resampled ids for every metric of the task; the interval is the 2.5 and 97.5 percentiles of
  the resampled differences (linear interpolation between order statistics);
* for a binary metric (every paired value 0 or 1): McNemar's exact test on the discordant
  pairs, b = 1->0 and c = 0->1 (two-sided binomial, p = min(1, 2 * sum_{k<=min(b,c)}
  C(b+c, k) / 2^(b+c)), p = 1 when b + c = 0), and the ids that flipped each way.

When the primary metric is not binary, the rows' ``overall.passed`` is compared the same way
(as ``overall.passed``). A diff of the settings follows: model name, model_id and args, the
run settings that change results, each task's version, task folder hash and data hashes
(inputs.json), gage-eval and plugin versions (summary.json ``run.versions``) and, when the
runs have it, ``run.reproducibility``.

Statistics use the standard library only (math.comb, random.Random). See docs/compare.md.
"""

DEFAULT_SEED = 1234
DEFAULT_SAMPLES = 1000
CONFIDENCE = 0.95
SHOW_FLIPS = 5  # ids of each flip direction the console shows (--json and --html: all)
UP, DOWN = "0->1", "1->0"


def mcnemar_exact_p(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value on the discordant pairs b and c (binomial, p = 1/2)."""
    n = b + c
    if n == 0:
        return 1.0
    # sum_{k<=min(b,c)} C(n, k) in exact integers: C(n, k+1) = C(n, k) * (n - k) / (k + 1) (the
    # division is exact), one product per term instead of a fresh math.comb (which is quadratic
    # at 100k discordant pairs); then one correctly rounded division by 2^n
    term = tail = 1
    for k in range(min(b, c)):
        term = term * (n - k) // (k + 1)
        tail += term
    return min(1.0, (2 * tail) / (1 << n))
