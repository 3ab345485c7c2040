"""KServe's own Python model server on loopback, for the runner's tests and benchmarks.

``python -m hack.model_server --port P`` serves two models with ``kserve.ModelServer``
(the runtime of KServe's sklearn/xgboost images), HTTP only, one worker:

- ``sklearn-iris``: a scikit-learn classifier trained at start on the iris data set.
  v2 input ``input-0`` FP32 ``[-1, 4]`` -> output ``output-0`` INT64 ``[n]``;
  v1 ``{"instances": [[f, f, f, f], ...]}`` -> ``{"predictions": [int, ...]}``.
- ``ttm``: shaped like the Granite TTM model upstream serves with Triton.
  v2 input ``past_values`` FP32 ``[-1, 512, 1]`` -> output ``forecast_output`` FP32
  ``[n, 96, 1]``; v1 instances of 512 values -> 96 values each. The "forecast" is a
  linear extrapolation of the last two points: deterministic and cheap, which is all
  a test of the plumbing needs.

A request of the wrong shape is answered 400 with the server's JSON ``{"error": ...}``
(``kserve.errors.InvalidInput``), an unknown model 404.

Importable without starting anything: :func:`train_iris`, :func:`iris_predict` and
:func:`ttm_forecast` give tests the same predictions the server computes. ``kserve``
itself is imported lazily because it parses ``sys.argv`` at import time.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:
    from sklearn.tree import DecisionTreeClassifier

IRIS_MODEL = "sklearn-iris"
IRIS_INPUT = "input-0"
IRIS_FEATURES = 4
TTM_MODEL = "ttm"
TTM_INPUT = "past_values"
TTM_CONTEXT = 512
TTM_HORIZON = 96


@cache
def train_iris() -> DecisionTreeClassifier:
    """The iris classifier, trained deterministically so tests can predict locally."""
    from sklearn.datasets import load_iris
    from sklearn.tree import DecisionTreeClassifier

    data = load_iris()
    classifier = DecisionTreeClassifier(random_state=0)
    classifier.fit(data.data, data.target)
    return classifier


def iris_predict(rows: Any) -> NDArray[np.int64]:
    array = np.asarray(rows, dtype=np.float32)
    if array.ndim != 2 or array.shape[1] != IRIS_FEATURES:
        raise ValueError(
            f"expected rows of {IRIS_FEATURES} features, got an array of shape {list(array.shape)}"
        )
    return np.asarray(train_iris().predict(array), dtype=np.int64)


def ttm_forecast(series: Any) -> NDArray[np.float32]:
    """[n, 512] or [n, 512, 1] -> [n, 96, 1]: the last step's slope carried forward."""
    array = np.asarray(series, dtype=np.float32)
    if array.ndim == 2:
        array = array[:, :, None]
    if array.ndim != 3 or array.shape[1:] != (TTM_CONTEXT, 1):
        raise ValueError(f"expected series of shape [n, {TTM_CONTEXT}, 1], got {list(array.shape)}")
    last = array[:, -1, 0]
    slope = last - array[:, -2, 0]
    steps = np.arange(1, TTM_HORIZON + 1, dtype=np.float32)
    forecast = last[:, None] + slope[:, None] * steps[None, :]
    return forecast[:, :, None].astype(np.float32)


def build_models() -> list[Any]:
    """The two ``kserve.Model`` instances, loaded and ready."""
    import kserve
    from kserve.errors import InvalidInput
    from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse

    def first_input(payload: Any) -> Any:
        if isinstance(payload, InferRequest):
            if not payload.inputs:
                raise InvalidInput("the request has no inputs")
            return payload.inputs[0].as_numpy()
        if isinstance(payload, dict) and "instances" in payload:
            return payload["instances"]
        raise InvalidInput('expected a v2 request or a v1 body {"instances": [...]}')

    def answer(payload: Any, model: str, name: str, result: NDArray[Any], dtype: str) -> Any:
        if isinstance(payload, InferRequest):
            output = InferOutput(name=name, shape=list(result.shape), datatype=dtype)
            output.set_data_from_numpy(result, binary_data=False)
            return InferResponse(
                response_id=payload.id or "", model_name=model, infer_outputs=[output]
            )
        if result.ndim == 3:
            result = result[:, :, 0]
        return {"predictions": result.tolist()}

    class PlumbingModel(kserve.Model):  # type: ignore[misc]
        """One v2 input, one v2 output, and the function from one to the other."""

        def __init__(
            self,
            name: str,
            input_type: dict[str, Any],
            output_type: dict[str, Any],
            compute: Callable[[Any], NDArray[Any]],
            prepare: Callable[[], object] = lambda: None,
        ) -> None:
            super().__init__(name)
            self.input_type, self.output_type = input_type, output_type
            self.compute, self.prepare = compute, prepare

        def load(self) -> bool:
            self.prepare()
            self.ready = True
            return True

        def get_input_types(self) -> list[dict[str, Any]]:
            return [self.input_type]

        def get_output_types(self) -> list[dict[str, Any]]:
            return [self.output_type]

        async def predict(
            self,
            payload: Any,
            headers: dict[str, str] | None = None,
            response_headers: dict[str, str] | None = None,
        ) -> Any:
            try:
                result = self.compute(first_input(payload))
            except ValueError as exc:
                raise InvalidInput(str(exc)) from exc
            output = self.output_type
            return answer(payload, self.name, output["name"], result, output["datatype"])

    models: list[Any] = [
        PlumbingModel(
            IRIS_MODEL,
            {"name": IRIS_INPUT, "datatype": "FP32", "shape": [-1, IRIS_FEATURES]},
            {"name": "output-0", "datatype": "INT64", "shape": [-1]},
            iris_predict,
            prepare=train_iris,  # train at start, not on the first request
        ),
        PlumbingModel(
            TTM_MODEL,
            {"name": TTM_INPUT, "datatype": "FP32", "shape": [-1, TTM_CONTEXT, 1]},
            {"name": "forecast_output", "datatype": "FP32", "shape": [-1, TTM_HORIZON, -1]},
            ttm_forecast,
        ),
    ]
    for model in models:
        model.load()
    return models


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hack.model_server",
        description="Serve the iris and TTM-shaped test models with KServe's model server.",
    )
    parser.add_argument("--port", type=int, default=8080, help="HTTP port")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    args = parser.parse_args(argv)
    # kserve parses sys.argv when imported: hand it nothing it could misread.
    sys.argv = sys.argv[:1]
    import kserve
    import kserve.protocol.rest.server as rest_server

    # KServe hard-codes host 0.0.0.0; a test server has no business outside loopback.
    uvicorn_config = rest_server.uvicorn.Config

    def loopback_config(*config_args: Any, **config_kwargs: Any) -> Any:
        config_kwargs["host"] = args.host
        return uvicorn_config(*config_args, **config_kwargs)

    rest_server.uvicorn.Config = loopback_config
    models = build_models()
    kserve.ModelServer(http_port=args.port, enable_grpc=False, workers=1).start(models)
    return 0


if __name__ == "__main__":
    sys.exit(main())
