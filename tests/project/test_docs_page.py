"""/docs in a real headless Chromium: Swagger UI reads the server's OpenAPI 3.1 document and lists every operation,
from local files only (skipped where playwright or a Chromium is not installed)."""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx
import pytest

from ..conftest import needs_chromium

pytest.importorskip("playwright.sync_api")
pytestmark = needs_chromium  # the page: conftest's Chromium page, one per module


def test_docs_list_every_operation_of_the_document(page, fake_server_url):
    spec = httpx.get(fake_server_url + "/openapi.json").json()
    assert spec["openapi"].startswith("3.1")  # the document as FastAPI writes it, not downgraded for the viewer
    expected = {(method.upper(), path) for path, operations in spec["paths"].items() for method in operations}
    assert {("POST", "/v1/systemone"), ("GET", "/v1/models"), ("POST", "/v1/chat/completions")} <= expected
    assert {("GET", "/health"), ("GET", "/metrics")} <= expected

    page.goto(fake_server_url + "/docs")
    # operations listed, or the message of a Swagger UI that cannot read the document (`version-pragma`)
    page.wait_for_selector(".swagger-ui :is(.opblock, .version-pragma, .errors-wrapper)")
    text = page.inner_text("body")
    assert "Unable to render" not in text and "valid version field" not in text, text[:500]
    listed = {
        (
            block.eval_on_selector(".opblock-summary-method", "e => e.textContent.trim()"),
            block.eval_on_selector(".opblock-summary-path", "e => e.dataset.path"),
        )
        for block in page.query_selector_all(".swagger-ui .opblock")
    }
    assert listed == expected
    assert spec["info"]["title"] in page.inner_text(".swagger-ui .info .title")

    # an operation opened shows an example body built from its request schema (a $ref) and every status it answers
    page.click(".opblock-post:has([data-path='/v1/systemone']) .opblock-summary")
    example = page.wait_for_selector(".opblock.is-open .opblock-section-request-body .body-param__example").inner_text()
    assert '"state"' in example and '"questions"' in example
    status_cells = ".opblock.is-open .responses-table .response > .response-col_status"
    statuses = page.eval_on_selector_all(status_cells, "els => els.map(e => e.textContent.trim())")
    assert statuses == list(spec["paths"]["/v1/systemone"]["post"]["responses"])
    assert "Could not resolve" not in page.inner_text("body") and not page.query_selector(".swagger-ui .errors-wrapper")

    origin = "{0.scheme}://{0.netloc}".format(urlsplit(fake_server_url))
    assert all(url.startswith((origin, "data:")) for url in page.requested), "no CDN: " + str(page.requested)
    assert not page.errors
