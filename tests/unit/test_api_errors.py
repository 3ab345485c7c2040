"""How the API server's refusals are told apart (kubeclient/errors.py)."""

from __future__ import annotations

from kubeclient.errors import api_error


def test_a_create_refused_in_a_namespace_being_deleted_is_told_apart() -> None:
    terminating = {
        "kind": "Status",
        "status": "Failure",
        "message": 'jobs.batch "inf-r" is forbidden: unable to create new content in '
        "namespace ns because it is being terminated",
        "reason": "Forbidden",
        "details": {
            "name": "inf-r",
            "group": "batch",
            "kind": "jobs",
            "causes": [
                {
                    "reason": "NamespaceTerminating",
                    "message": "namespace ns is being terminated",
                    "field": "metadata.namespace",
                }
            ],
        },
        "code": 403,
    }
    assert api_error(403, terminating).is_namespace_terminating
    # The message alone (an older server or a proxy that kept only the message) says so too.
    bare = {**terminating, "details": {}}
    assert api_error(403, bare).is_namespace_terminating
    rbac = {
        "kind": "Status",
        "message": 'jobs.batch is forbidden: User "x" cannot create resource "jobs"',
        "reason": "Forbidden",
        "code": 403,
    }
    assert not api_error(403, rbac).is_namespace_terminating
    assert not api_error(409, terminating).is_namespace_terminating
    assert not api_error(403, b"not json").is_namespace_terminating
