"""How a config's auth, headers and TLS reach the runner pod and its contract, and never more."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from contract.exitcodes import PERMANENT, REASONS, ExitCode
from controller.api import InferenceConfig, InferenceRun, run_config_warnings
from controller.invalid import describe_invalid
from controller.probe import ConfigView, plan_config
from controller.render import desired_configmap, desired_job
from tests.unit.helpers import NOW, UID


def config(**kserve: Any) -> InferenceConfig:
    return InferenceConfig.model_validate(
        {
            "metadata": {"name": "cfg", "namespace": "ns", "uid": "cfg-uid"},
            "spec": {
                "image": "runner:1",
                "kserve": {"modelUrl": "https://m.example.com/v2/models/m/infer", **kserve},
                "storage": {"input": {"http": {"url": "http://in"}}},
            },
        }
    )


RUN = InferenceRun.model_validate(
    {
        "metadata": {"name": "r", "namespace": "ns", "uid": UID},
        "spec": {"configRef": {"name": "cfg"}},
    }
)


def pod(cfg: InferenceConfig) -> dict[str, Any]:
    spec: dict[str, Any] = desired_job(RUN, cfg)["spec"]["template"]["spec"]
    return spec


def contract(cfg: InferenceConfig) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(desired_configmap(RUN, cfg)["data"]["contract.json"])
    return parsed


def test_a_secrets_token_is_mounted_whole_and_only_its_path_is_in_the_contract() -> None:
    cfg = config(auth={"bearerTokenSecretRef": {"name": "model-token", "key": "jwt"}})
    spec = pod(cfg)
    volume = next(v for v in spec["volumes"] if v["name"] == "model-token")
    assert volume["secret"]["secretName"] == "model-token"
    assert volume["secret"]["items"] == [{"key": "jwt", "path": "token"}]
    mount = next(m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "model-token")
    # A whole volume, not a subPath: the kubelet rewrites a rotated token in place.
    assert mount == {
        "name": "model-token",
        "mountPath": "/var/run/secrets/kserve-inference/model-token",
        "readOnly": True,
    }
    assert contract(cfg)["kserve"]["transport"] == {
        "tokenFile": "/var/run/secrets/kserve-inference/model-token/token"
    }


def test_a_projected_service_account_token_has_its_audience() -> None:
    cfg = config(auth={"serviceAccountToken": {"audience": "models.example.com"}})
    volume = next(v for v in pod(cfg)["volumes"] if v["name"] == "model-token")
    assert volume["projected"]["sources"] == [
        {
            "serviceAccountToken": {
                "audience": "models.example.com",
                "expirationSeconds": 3600,
                "path": "token",
            }
        }
    ]


def test_headers_and_a_ca_bundle_from_a_configmap() -> None:
    cfg = config(
        headers={"Host": "m.models.example.com"},
        tls={"caBundle": {"configMapRef": {"name": "model-ca"}}},
    )
    volume = next(v for v in pod(cfg)["volumes"] if v["name"] == "model-ca")
    assert volume["configMap"] == {
        "name": "model-ca",
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }
    assert contract(cfg)["kserve"]["transport"] == {
        "headers": {"Host": "m.models.example.com"},
        "caFile": "/var/run/secrets/kserve-inference/model-ca/ca.crt",
    }


def test_nothing_is_added_without_a_transport() -> None:
    cfg = config()
    assert "transport" not in contract(cfg)["kserve"]
    assert [v["name"] for v in pod(cfg)["volumes"]] == ["tmp", "contract"]


def test_insecure_skip_verify_is_a_warning_on_the_runs_and_the_config() -> None:
    cfg = config(tls={"insecureSkipVerify": True})
    assert contract(cfg)["kserve"]["transport"] == {"insecureSkipVerify": True}
    assert [r for r, _ in run_config_warnings(RUN, cfg)] == ["InsecureSkipVerify"]
    raw = {"metadata": cfg.metadata.to_api(), "spec": cfg.spec.to_api()}
    status = plan_config(ConfigView(raw=raw, now=NOW, config=cfg)).status
    warning = next(c for c in status.conditions if c.type == "Warning")
    assert (warning.status, warning.reason) == ("True", "InsecureSkipVerify")
    safe = config()
    raw = {"metadata": safe.metadata.to_api(), "spec": safe.spec.to_api()}
    assert not [
        c
        for c in plan_config(ConfigView(raw=raw, now=NOW, config=safe)).status.conditions
        if c.type == "Warning"
    ]


@pytest.mark.parametrize(
    ("kserve", "reason", "words"),
    [
        ({"headers": {"Authorization": "Bearer abc"}}, "InlineCredentials", "use kserve.auth"),
        ({"headers": {"X-Api-Key": "abc"}}, "InlineCredentials", "use kserve.auth"),
        ({"headers": {"Bad Header": "x"}}, "InvalidSpec", "not a header name"),
        ({"auth": {}}, "InvalidSpec", "exactly one"),
        (
            {
                "auth": {
                    "bearerTokenSecretRef": {"name": "t"},
                    "serviceAccountToken": {"audience": "a"},
                }
            },
            "InvalidSpec",
            "exactly one",
        ),
        ({"tls": {"caBundle": {}}}, "InvalidSpec", "exactly one"),
    ],
)
def test_what_cannot_be_sent_is_refused(kserve: dict[str, Any], reason: str, words: str) -> None:
    with pytest.raises(ValidationError) as caught:
        config(**kserve)
    got, message = describe_invalid(caught.value)
    assert got == reason
    assert words in message
    assert "abc" not in message  # a credential written there is never repeated


def test_a_refused_credential_is_its_own_permanent_exit_code() -> None:
    assert REASONS[ExitCode.MODEL_AUTH] == "ModelAuthFailed"
    assert ExitCode.MODEL_AUTH in PERMANENT
