"""The Tinker SDK's protobuf messages: ``forward_backward`` requests in, ``ForwardBackwardOutput``
and ``SampleResponse`` out. Built from the SDK's own file descriptor (wire_descriptor,
tools/tinker_proto.py) in a pool of their own, so that they never clash with an SDK imported
into the same process."""

from __future__ import annotations

from typing import Any

import numpy as np
import zstandard
from google.protobuf import descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from swarm_contracts.inference import TokenLogprob
from swarm_contracts.sessions import SessionDatum, SessionResult
from swarm_gateway.tinker.records import SampleOutcome, TensorOut
from swarm_gateway.tinker.wire_descriptor import FILE_DESCRIPTOR

_POOL = descriptor_pool.DescriptorPool()
_POOL.AddSerializedFile(FILE_DESCRIPTOR)


def _message(name: str) -> Any:
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"tinker_public.{name}"))


ForwardBackwardRequest = _message("ForwardBackwardRequest")
ForwardBackwardOutput = _message("ForwardBackwardOutput")
SampleResponse = _message("SampleResponse")
_STOP_REASON = {
    v.name.removeprefix("STOP_REASON_").lower(): v.number
    for v in _POOL.FindEnumTypeByName("tinker_public.StopReason").values
}
_DTYPE = _POOL.FindEnumTypeByName("tinker_public.DType").values_by_name
_FLOAT32 = _DTYPE["DTYPE_FLOAT32"].number
_INT64 = _DTYPE["DTYPE_INT64"].number
_NUMPY = {_FLOAT32: np.float32, _INT64: np.int64}
MAX_BODY = 64 << 20  # decompressed
# The SDK's filling of a top-k position with fewer than k tokens (tinker.types.topk_logprobs).
MASK_TOKEN, MASK_LOGPROB = 0, -99999.0


class WireError(ValueError):
    """A request body the gateway cannot read: a 400 naming the field."""


class FwdBwd:
    def __init__(
        self,
        model_id: str,
        seq_id: int,
        loss_fn: str,
        config: dict[str, float],
        forward_only: bool,
        data: list[SessionDatum],
    ) -> None:
        self.model_id = model_id
        self.seq_id = seq_id
        self.loss_fn = loss_fn
        self.config = config
        self.forward_only = forward_only
        self.data = data


def decode_forward_backward(body: bytes, encoding: str | None) -> FwdBwd:
    if encoding == "zstd":
        try:
            body = zstandard.ZstdDecompressor().decompress(body, max_output_size=MAX_BODY)
        except zstandard.ZstdError as exc:
            raise WireError(f"body: not zstd ({exc})") from exc
    elif encoding not in (None, "", "identity"):
        raise WireError(f"Content-Encoding: {encoding!r} is not served (zstd or none)")
    msg = ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except DecodeError as exc:
        raise WireError(f"body: not a ForwardBackwardRequest ({exc})") from exc
    config: dict[str, float] = {}
    for key, value in msg.loss_fn_config_v2.items():
        if value.WhichOneof("value") != "number":
            raise WireError(f"loss_fn_config.{key}: only numbers are served")
        config[key] = value.number
    for key, number in msg.loss_fn_config.items():
        config.setdefault(key, number)
    data = [_datum(i, d) for i, d in enumerate(msg.data)]
    return FwdBwd(msg.model_id, msg.seq_id, msg.loss_fn, config, msg.forward_only, data)


def _datum(i: int, datum: Any) -> SessionDatum:
    tokens: list[int] = []
    for j, chunk in enumerate(datum.model_input):
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise WireError(f"data[{i}].model_input.chunks[{j}]: {kind} chunks are not served")
        tokens.extend(np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist())
    if not tokens:
        raise WireError(f"data[{i}].model_input: no tokens")
    inputs = {
        name: _tensor(f"data[{i}].loss_fn_inputs.{name}", t)
        for name, t in datum.loss_fn_inputs.items()
    }
    return SessionDatum(tokens=tokens, inputs=inputs)


def _tensor(field: str, tensor: Any) -> list[float]:
    dtype = _NUMPY.get(tensor.dtype)
    if dtype is None:
        raise WireError(f"{field}: dtype {tensor.dtype} is not served (float32, int64)")
    if tensor.HasField("sparse_csr"):
        raise WireError(f"{field}: sparse tensors are not served")
    try:
        return np.frombuffer(tensor.dense, dtype=dtype).astype(np.float64).tolist()
    except ValueError as exc:
        raise WireError(f"{field}: {exc}") from exc


def encode_forward_backward_output(result: SessionResult) -> bytes:
    """One ``ArrayRecord`` of the per-datum float32 outputs, as the SDK reads it back."""
    out = ForwardBackwardOutput()
    out.loss_fn_output_type = "ArrayRecord"
    for key, value in result.metrics.items():
        out.metrics[key] = value
    if result.outputs:
        record = out.loss_fn_outputs.add()
        record.num_datums = len(result.outputs)
        for name in result.outputs[0]:
            arrays = [np.asarray(o[name], dtype=np.float32) for o in result.outputs]
            offsets = np.cumsum([0] + [a.nbytes for a in arrays], dtype=np.int64)
            field = record.fields[name]
            field.dtype = _FLOAT32
            field.data = b"".join(a.tobytes() for a in arrays)
            field.offsets = offsets.tobytes()
    return bytes(out.SerializeToString())


def _topk(message: Any, rows: list[list[TokenLogprob]] | list[list[TokenLogprob] | None]) -> None:
    """``rows`` into a ``TopkLogprobs``: dense (length, k) int32 ids and float32 logprobs, k the
    longest row's, a shorter row (or none: None) padded with the SDK's sentinels."""
    k = max((len(row) for row in rows if row), default=0)
    ids = np.full((len(rows), k), MASK_TOKEN, dtype=np.int32)
    logprobs = np.full((len(rows), k), MASK_LOGPROB, dtype=np.float32)
    for i, row in enumerate(rows):
        for j, (token, logprob) in enumerate(row or ()):
            ids[i, j], logprobs[i, j] = token, logprob
    message.length, message.k = len(rows), k
    message.token_ids, message.logprobs = ids.tobytes(), logprobs.tobytes()


def _float_tensor(message: Any, tensor: TensorOut) -> None:
    """``tensor`` into a ``Tensor``: float32, its shape, dense or CSR (int64 indices)."""
    message.dtype = _FLOAT32
    message.shape.extend(tensor.shape)
    values = np.asarray(tensor.values, dtype=np.float32).tobytes()
    if tensor.crow is None:
        message.dense = values
        return
    message.sparse_csr.values = values
    message.sparse_csr.crow_indices = np.asarray(tensor.crow, dtype=np.int64).tobytes()
    message.sparse_csr.col_indices = np.asarray(tensor.col or [], dtype=np.int64).tobytes()


def _alt_tokens(message: Any, rows: list[list[TokenLogprob]]) -> None:
    """Each prompt position's draws as the SDK's two dense ``[positions, k]`` tensors: int64
    ids, float32 log-probabilities."""
    k = len(rows[0]) if rows else 0
    ids = np.asarray([[t for t, _ in row] for row in rows], dtype=np.int64).reshape(len(rows), k)
    scores = np.asarray([[v for _, v in row] for row in rows], dtype=np.float32)
    message.tokens.dtype, message.logprobs.dtype = _INT64, _FLOAT32
    message.tokens.shape.extend([len(rows), k])
    message.logprobs.shape.extend([len(rows), k])
    message.tokens.dense = ids.tobytes()
    message.logprobs.dense = scores.reshape(len(rows), k).tobytes()


def encode_sample_response(outcome: SampleOutcome) -> bytes:
    """The sampled sequences (int32 token ids, float32 log-probabilities, their top-k) and the
    prompt's log-probabilities (float32, NaN for the first token and those not scored), top-k,
    target ids' log-probabilities and alternative tokens, as raw bytes."""
    out = SampleResponse()
    if outcome.target_prompt_logprobs is not None:
        _float_tensor(out.target_prompt_logprobs, outcome.target_prompt_logprobs)
    if outcome.prompt_alt_tokens is not None:
        _alt_tokens(out.prompt_alt_tokens, outcome.prompt_alt_tokens)
    if outcome.prompt_logprobs is not None:
        scores = [np.nan if v is None else v for v in outcome.prompt_logprobs]
        out.prompt_logprobs = np.asarray(scores, dtype=np.float32).tobytes()
    if outcome.topk_prompt_logprobs is not None:
        _topk(out.topk_prompt_logprobs, outcome.topk_prompt_logprobs)
    for sequence in outcome.sequences:
        seq = out.sequences.add()
        seq.stop_reason = _STOP_REASON[sequence.stop_reason]
        seq.tokens = np.asarray(sequence.tokens, dtype=np.int32).tobytes()
        if sequence.logprobs is not None:
            seq.logprobs = np.asarray(sequence.logprobs, dtype=np.float32).tobytes()
        if sequence.topk_logprobs is not None:
            _topk(seq.topk_sampled_logprobs, sequence.topk_logprobs)
    return bytes(out.SerializeToString())
