"""Serving a model, below HTTP: the model worker (a bounded queue, batching across requests, forwards in flight),
the model in this process or in a process of its own, the serving process's memory, the server's settings and
options, and the statuses its errors map to.

    worker         ModelWorker: requests prepared on host threads, batched, launched and finished on threads of its own
    batching       one forward's limits (requests, tokens): the worker's and the batch jobs'
    served         ServedModel (what the routes answer with), InProcessModel (a decider behind a worker)
    model_process  ModelProcess: the same in a process of its own (`typedlm serve`'s default)
    heap           the serving processes' memory (mmap threshold, trims once idle) and the collector's frozen start-up
    settings       ServerSettings: what a server enforces (keys, queue, timeout, batching, body limits)
    options        ServeOptions: all `serve` is told (model and settings), for one server or each replica
    status         errors as HTTP statuses and bodies (503 overloaded, 504 timed out, 413, 422, ...), no framework

It never imports torch or FastAPI: a decider arrives from above (`typedlm serve`, a replica, a test) and the HTTP
layer (`typedlm.server`) and the batch jobs (`typedlm.jobs`) use it.
"""
