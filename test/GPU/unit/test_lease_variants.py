"""lease.sh's VARIANTS name only options the compiler has, each off its default, and each variant's option string is
one moe-lower-to-nvvm accepts: after an option is decided or deleted (issue 80 item 4) a stale row would otherwise
surface only at a GPU lease, as a folder whose build fails in `lease.sh prepare`. Needs moe-opt ($MOE_OPT, else
build/bin/moe-opt): skipped without it."""

import os
import re
import subprocess

import pytest

import simt
from test_lease_script import variant_rows

HERE = os.path.dirname(os.path.abspath(__file__))
PASSES_TD = os.path.join(HERE, "..", "..", "..", "include", "MoE", "Conversion", "Passes.td")
MOE_OPT = simt.find_moe_opt() or pytest.skip("no moe-opt ($MOE_OPT, build/bin)", allow_module_level=True)


def pass_options():
    """{option: its default as Passes.td writes it} of every pass option."""
    text = open(PASSES_TD).read()
    return {m.group(1): m.group(2) for m in re.finditer(r'Option<"\w+",\s*"([\w-]+)",\s*"[\w:]+",\s*'
                                                        r'/\*default=\*/"([^"]*)"', text)}


def test_passes_td_is_read():
    options = pass_options()
    assert {"flash-mma-block-rows", "flash-causal-balance", "topk-rounds"} <= set(options), sorted(options)


@pytest.mark.parametrize("row", variant_rows(), ids=lambda row: row[0])
def test_variant_options_exist_and_leave_their_defaults(row):
    name, opts, chip = row[0], row[1].split(), row[5] or "sm_90"
    options = pass_options()
    for opt in opts:
        key, _, value = opt.partition("=")
        assert key in options, f"variant {name}: {key} is no pass option (deleted? Passes.td has {sorted(options)})"
        default = options[key].strip("\\\"")
        assert value != default, f"variant {name}: {key}={value} is the default: nothing for the lease to decide"
    # The pipeline parses the variant's options (an unknown option or a bad value is an error here).
    p = subprocess.run([MOE_OPT, "-", f"--moe-lower-to-nvvm=chip={chip} format=isa {' '.join(opts)}".strip()],
                       input="module {}\n", capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"variant {name}: moe-opt refused its options:\n{p.stderr[-2000:]}"
