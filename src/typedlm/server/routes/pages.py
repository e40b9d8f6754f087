"""The pages: the playground at / and /playground, the API's docs at /docs (Swagger UI 5, which reads OpenAPI 3.1,
from local files served under DOCS_ASSETS). None of them is in the OpenAPI document."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse

DOCS_ASSETS = "/docs-assets"  # Swagger UI's files, served from the fastapi-offline package: /docs works offline
PLAYGROUND = Path(__file__).parent.parent / "static" / "playground.html"


def router(openapi_url: str, title: str) -> APIRouter:
    """The pages of an app whose OpenAPI document is at `openapi_url` and whose title is `title`."""
    routes = APIRouter()
    playground_page = PLAYGROUND.read_text(encoding="utf-8")

    @routes.get("/", include_in_schema=False)
    @routes.get("/playground", include_in_schema=False)
    async def playground() -> HTMLResponse:
        """A page to try the server: a document, questions, the answers as bars, the request as curl and Python."""
        return HTMLResponse(playground_page)

    @routes.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{title} API",
            swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{DOCS_ASSETS}/favicon.png",
        )

    return routes
