"""GET /v1/models: the model served and its aliases, each with the settings' release date."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from typedlm.core.settings import ServerSettings
from typedlm.hosting.served import ServedModel
from typedlm.server import schemas
from typedlm.server.routes.common import bearer, error_responses


def router(served: ServedModel, settings: ServerSettings, version: str) -> APIRouter:
    """The list of models of a server, typedlm `version`, answering with `served` under `settings`."""
    routes = APIRouter()

    @routes.get(
        "/v1/models",
        dependencies=[Depends(bearer(settings))],
        response_model=schemas.ModelList,
        summary="List models",
        responses=error_responses({401: "auth on and the key missing or wrong"}),
    )
    async def models() -> dict[str, Any]:
        own = {"name": served.name, "description": f"{served.name}, served by typedlm {version}"}
        aliases = [{"name": alias, "description": f"Alias of {served.name}"} for alias in settings.aliases]
        return {"models": [{**m, "release_date": settings.release_date} for m in [own, *aliases]]}

    return routes
