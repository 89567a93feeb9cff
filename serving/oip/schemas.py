"""The Open Inference Protocol's JSON bodies as pydantic models: the OpenAPI contract of ``/v2``.

They describe the bodies (the spec, and the fuzz test that holds the routes to
it); the routes parse and answer without building them, as ``/v1`` does. The
shapes follow the protocol's REST specification (KServe "V2 inference
protocol", the same as Triton's HTTP API).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "InferRequestBody",
    "InferResponseBody",
    "ModelMetadata",
    "OipError",
    "ServerMetadata",
    "TensorMetadata",
]


class OipError(BaseModel):
    error: str = Field(description="the reason, then what was wrong: `bad_id: input 'C1': ids must be >= 0`")


class ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]


class TensorMetadata(BaseModel):
    name: str
    datatype: str = Field(description="the datatype to send (a sparse feature's: BYTES, ids by the id rule)")
    shape: list[int] = Field(description="-1: any size")
    parameters: dict[str, Any] | None = Field(
        None, description="datatypes: every datatype the input takes (inputs only)"
    )


class ModelMetadata(BaseModel):
    name: str
    versions: list[str] = Field(description="the version this replica has loaded (empty before the first)")
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class _RequestTensor(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    shape: list[int]
    datatype: str
    parameters: dict[str, Any] | None = Field(None, description="binary_data_size: its bytes after the JSON")
    data: list[Any] | None = Field(None, description="row-major values, flat or nested; BYTES as strings")


class _RequestOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    parameters: dict[str, Any] | None = Field(None, description="binary_data: true for raw FP32 bytes")


class InferRequestBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str | None = None
    model_name: str | None = Field(None, description="taken and ignored: the path names the model")
    model_version: str | None = Field(None, description="taken and ignored: the path names the version")
    parameters: dict[str, Any] | None = Field(
        None, description="binary_data_output: every output as raw bytes after the JSON"
    )
    inputs: list[_RequestTensor] = Field(min_length=1)
    outputs: list[_RequestOutput] | None = Field(None, description="absent: every task's output")


class _ResponseTensor(BaseModel):
    name: str
    datatype: str
    shape: list[int]
    parameters: dict[str, Any] | None = None
    data: list[float] | None = None


class InferResponseBody(BaseModel):
    model_name: str
    model_version: str
    id: str | None = None
    parameters: dict[str, Any] = Field(
        description="Kelp's: model_created_at, model_age_s, embedding_age_max_s, embedding_age_mean_s, "
        "default_row_rate (as /v1/score answers them)"
    )
    outputs: list[_ResponseTensor] = Field(description="per task, FP32 [B]: sigmoid(logit), in request order")
