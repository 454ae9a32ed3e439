"""Pre-flight checks: short real runs and measurements that catch, before a long job, what
would waste it (a model that does not train, mismatched installs, a slow loader, skewed
shards, a straggler, workers that do not scale, slow links, checkpoints that do not resume).

`sextant.checks.analyse` holds the judgements (pure functions over run records);
`sextant.checks.suite` makes the runs; `sextant check` prints the results. See docs/checks.md.
"""

from sextant.checks.result import FAIL, PASS, SKIP, WARN, CheckResult, worst

__all__ = ["FAIL", "PASS", "SKIP", "WARN", "CheckResult", "worst"]
