"""The Open Inference Protocol (KServe v2) over REST: the wire format, named inputs, and the routes.

* :mod:`~kelp.serving.oip.tensors`: requests and responses on the wire (JSON and binary tensor data);
* :mod:`~kelp.serving.oip.inputs`: named tensors -> the scorer's batch, by the feature spec;
* :mod:`~kelp.serving.oip.schemas`: the bodies as pydantic models, for the OpenAPI spec;
* :mod:`~kelp.serving.oip.routes`: the ``/v2`` endpoints, declared on the serving app.
"""
