from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
PEER_GRAPHS = SHARED / "peer-graphs"


@pytest.fixture
def peer_graphs() -> Path:
    if not PEER_GRAPHS.is_dir():
        pytest.skip("../shared/peer-graphs is absent (third-party data, read in place)")
    return PEER_GRAPHS
