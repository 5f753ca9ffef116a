"""The interactive OpenAPI page at `/docs`, with Swagger UI's script and style served by the service itself (from the
`swagger-ui-bundle` package of the `serve` extra) instead of a CDN, so it renders on a machine without a network."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, PlainTextResponse
from fastapi.staticfiles import StaticFiles

ASSETS = "/docs/assets"
ASSET_FILES = ("swagger-ui-bundle.js", "swagger-ui.css", "favicon-32x32.png")


def swagger_assets() -> Path | None:
    """Swagger UI's files, where `swagger-ui-bundle` is installed and holds them."""
    try:
        import swagger_ui_bundle
    except ImportError:
        return None
    folder = Path(swagger_ui_bundle.swagger_ui_path)
    return folder if all((folder / name).is_file() for name in ASSET_FILES) else None


def add_docs(app: FastAPI, title: str) -> None:
    """`GET /docs` on `app` (built with `docs_url=None`): Swagger UI from local files, or a plain answer saying what
    to install when they are missing (the schema itself is always at /openapi.json)."""
    folder = swagger_assets()
    if folder is not None:
        app.mount(ASSETS, StaticFiles(directory=folder), name="docs-assets")

    @app.get("/docs", include_in_schema=False, response_model=None)
    async def docs() -> HTMLResponse | PlainTextResponse:
        if folder is None:
            return PlainTextResponse("the interactive page needs swagger-ui-bundle (pip install -e '.[serve]'); the "
                                     f"schema is at {app.openapi_url}", status_code=404)
        return get_swagger_ui_html(openapi_url=app.openapi_url, title=f"{title} - API",
                                   swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{ASSETS}/swagger-ui.css",
                                   swagger_favicon_url=f"{ASSETS}/favicon-32x32.png")
