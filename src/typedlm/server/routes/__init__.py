"""The routes, a module per group, each a function `router(...)` returning an `APIRouter` over what it needs (the
served model, the settings, the metrics); `server.app.create_app` builds those and includes the routers in order.

    pages       the playground at / and /playground, the API's docs at /docs
    systemone   POST /v1/systemone; POST and GET /v1/systemone/feedback
    models      GET /v1/models
    operations  GET /health, GET /metrics
    chat        POST /v1/chat/completions (the OpenAI chat shape: `server.chat`)
    common      what several share: the bearer-key dependency, the model check, usage noted, OpenAPI error responses
"""
