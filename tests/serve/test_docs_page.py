"""`/docs` renders without a network: every script, style and icon it names is served by the service itself."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from bertology.serve import create_app
from bertology.serve.docs_page import swagger_assets

pytest.importorskip("swagger_ui_bundle", reason="swagger-ui-bundle is not installed (the serve extra)")


def test_docs_page_loads_only_local_assets(tiny_dir):
    assert swagger_assets() is not None
    with TestClient(create_app(tiny_dir, max_wait_ms=2)) as client:
        page = client.get("/docs")
        assert page.status_code == 200 and "swagger-ui" in page.text
        urls = re.findall(r"""(?:src|href)=['"]([^'"]+)['"]""", page.text) + re.findall(r"url: '([^']+)'", page.text)
        assert urls and not [url for url in urls if "://" in url or url.startswith("//")]  # no CDN
        for url in urls:
            answer = client.get(url)
            assert answer.status_code == 200 and answer.content, url
        assert "SwaggerUIBundle" in client.get("/docs/assets/swagger-ui-bundle.js").text
        assert client.get("/redoc").status_code == 404  # ReDoc needs a CDN: not offered
