"""Jobs: typedlm run over many requests at once, outside the server (`batch`: a file of requests in, answers out)."""
