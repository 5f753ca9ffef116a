from __future__ import annotations

from pathlib import Path

import pytest

from pretrain_helpers import make_assets


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_assets(tmp_path_factory.mktemp("pretrain-assets"))
