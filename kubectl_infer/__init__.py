"""``kubectl infer``: a kubectl plugin, a client of the InferenceRun API.

Not part of the controller: it reads and writes runs and configs through the
API server like any client, with the API client of ``kubeclient`` and
the names of :mod:`contract.api`, and imports nothing else of the controller
(the import-linter contract "plugin-is-a-client" in pyproject.toml).

- ``cli``: the command line, its commands and shell completion (I/O);
- ``runview``: what it builds, prints and decides, pure;
- ``kubeconfig``: the kubeconfig found and merged as kubectl does it.
"""
