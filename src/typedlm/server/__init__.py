"""The HTTP server: Jev's /v1/systemone, /v1/models and an OpenAI-style /v1/chat/completions.

It only translates: wire bodies ↔ plain data (`typedlm.core.questions`, `typedlm.core.answers`), errors → status
codes (in `errors`). It never imports torch: the model arrives as a `Decider`-like object.
"""

from typedlm.server.app import create_app
from typedlm.server.settings import ServerSettings

__all__ = ["ServerSettings", "create_app"]
