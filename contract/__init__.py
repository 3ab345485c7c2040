"""What the controller and the runner agree on, imported by both.

The controller renders a contract document (:mod:`contract.document`) into the
runner's pod at a path both know (:mod:`contract.paths`); the runner reports
back through its exit code (:mod:`contract.exitcodes`), its termination message
and its progress lines; both keep credentials out of what they write with one
definition of what a credential looks like (:mod:`contract.credentials`).

Nothing here imports the controller or the runner (the import-linter contract
"contract-shared" in pyproject.toml), and nothing here does I/O beyond reading
the environment for pod paths.
"""
