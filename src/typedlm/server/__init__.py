"""The HTTP server: Jev's /v1/systemone, /v1/models and an OpenAI-style /v1/chat/completions.

It only translates: wire bodies ↔ plain data (`typedlm.core.questions`, `typedlm.core.answers`), errors → status
codes (in `errors`), HTTP's own limits (`protocol`, `body`), metrics and the request log. It never imports torch:
the model arrives as a served model from the layer below (`typedlm.hosting`): a `Decider`-like object run in this
process (`hosting.served.InProcessModel`) or in a process of its own (`hosting.model_process.ModelProcess`, what
`typedlm serve` runs).
"""

from typedlm.core.settings import ServerSettings

__all__ = ["ServerSettings", "create_app"]


def __getattr__(name: str):
    # `create_app` on first use: the settings stay importable without FastAPI
    if name == "create_app":
        from typedlm.server.app import create_app

        return create_app
    raise AttributeError(name)
