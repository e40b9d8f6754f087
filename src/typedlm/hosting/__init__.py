"""Hosting a model below HTTP: the model worker (a bounded queue, batching across requests, forwards in flight), the
model in this process or in a process of its own, the hosting process's memory, and the statuses its errors map to.

    worker         ModelWorker: requests prepared on host threads, batched, launched and finished on threads of its own
    batching       one forward's limits (requests, tokens): the worker's and the batch jobs'
    served         ServedModel (what the routes answer with), InProcessModel (a decider behind a worker)
    model_process  ModelProcess: the same in a process of its own (`typedlm serve`'s default)
    heap           the hosting processes' memory (mmap threshold, trims once idle) and the collector's frozen start-up
    threads        a model loaded on a thread that ends, so that only the model thread keeps OpenMP workers
    status         errors as HTTP statuses and bodies (503 overloaded, 504 timed out, 413, 422, ...), no framework

What it is told is `typedlm.core.settings.ServerSettings`. It never imports torch or FastAPI: a decider arrives from
above (`typedlm serve`, a replica, a test) and the HTTP layer (`typedlm.server`) and the batch jobs (`typedlm.jobs`)
use it.
"""
