"""The table of every transformers MoE family under backend "moe" (python/tests/test_hf_families.py).

    MOE_FAMILIES_REPORT=/tmp/families.jsonl .venv/bin/python -m pytest python/tests/test_hf_families.py
    .venv/bin/python bench/hf_families_table.py /tmp/families.jsonl > bench/results/hf-families-<date>.md

One row per family the test ran (a family whose test failed before its report is missing: the test's summary says
why): the module compiled, what raising made of its graphs, or why its routing is left to inductor.
"""

import json
import sys


def main() -> None:
    rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    rows.sort(key=lambda r: r["family"])
    raised = [r for r in rows if r["not_raised"] is None]
    print(f"{len(rows)} families; routing raised in {len(raised)}, left to inductor (with the reason) in "
          f"{len(rows) - len(raised)}; every one equal to eager (outputs and gradients, T = 7, 1, 12).\n")
    print("| family | module compiled | raised (ops x count, all graphs) | routing left to inductor because |")
    print("|---|---|---|---|")
    for r in rows:
        ops = ", ".join(f"{op} x{n}" for op, n in sorted(r["raised"].items())) or "-"
        print(f"| {r['family']} | {r['module']} | {ops} | {r['not_raised'] or ''} |")


if __name__ == "__main__":
    main()
