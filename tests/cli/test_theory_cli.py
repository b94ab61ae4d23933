"""``poslens theory`` on the command line: the closed form of arXiv 2509.21042 as JSON."""

import json


def test_theory_cli_json(cli):
    code, stdout, _ = cli("theory", "kim", "--alpha", "0", "--seq-len", "3", "--json")
    assert code == 0
    d = json.loads(stdout)
    assert d["scores"][0][1] is None
    assert abs(d["scores"][1][0] - 0.154) < 1e-3
    assert abs(d["scores"][2][0] - 0.132) < 1e-3
    assert abs(d["scores"][2][1] - 0.150) < 1e-3
    assert len(d["g"]) == len(d["h"]) == 3
