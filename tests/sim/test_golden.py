"""The simulator reproduces its golden records (see ``golden.py``) to 1e-9 relative."""
import json

import pytest

from .golden import PATH, differences, recompute

DOC = json.loads(PATH.read_text())


@pytest.mark.parametrize("case", range(len(DOC["cases"])),
                         ids=[f"{c['g']}-{i}" for i, c in enumerate(DOC["cases"])])
def test_reproduces_golden_record(case):
    want = DOC["cases"][case]
    got = recompute(DOC, want)
    diff = differences(want["r"], got)
    assert not diff, "\n".join(diff[:20])
