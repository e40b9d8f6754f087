"""Online replicas on Ray Serve: the server's HTTP API answered by N model replicas behind one ingress.

    typedlm serve --replicas 2                                   # a local Ray
    serve run typedlm.replicas.app:app_builder replicas=2        # Ray Serve's own CLI (or a config file)

`forwarding`: a request as the ingress hands it to a replica, and the replica running it through the server's own
ASGI app. `keys`: the document a request is about. `routing`: the Ray Serve request router that sends a request to
the replica that has seen its document. `fanout`: /health and /metrics of all replicas as one. `app`: the
deployments. Ray is imported only by `routing` and `app` (`pip install 'typedlm[ray]'`).
"""
