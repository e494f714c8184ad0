"""`reconciler serve`: the HTTP API. Routes translate HTTP to the functions the CLI calls
(apply, commands, reads, graph) and their answers and errors to Kubernetes-shaped JSON
(wire.py); nothing here decides anything of its own."""
