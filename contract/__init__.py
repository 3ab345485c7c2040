"""What the controller, the runner and the kubectl plugin agree on, imported by each.

The controller renders a contract document (:mod:`contract.document`) into the
runner's pod at a path both know (:mod:`contract.paths`); the runner reports
back through its exit code (:mod:`contract.exitcodes`), its termination message
and its progress lines; both keep credentials out of what they write with one
definition of what a credential looks like (:mod:`contract.credentials`). The
names a client of the API reads (the labels on a run's children, the runner's
container) are :mod:`contract.api`, for the plugin.

Nothing here imports the controller, the runner or the plugin (the import-linter contract
"contract-shared" in pyproject.toml), and nothing here does I/O beyond reading
the environment for pod paths.
"""
