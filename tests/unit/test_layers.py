import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from check_layers import violations


def test_layering_rules_hold():
    assert violations() == []
