"""The gateway's ``SampleResponse`` read back by the stock SDK's own decoder: top-k as dense
(length, k) matrices, the SDK's sentinels where a position has fewer or none; target prompt
log-probabilities in the request's own layout (dense or CSR, as the SDK encodes them), prompt
alternatives as two dense tensors, and ``prompt_logprobs_last_n`` as the SDK checks it."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tinker.lib.public_interfaces.sampling_client import (
    _check_prompt_logprobs_last_n_honored,
    _tensor_data_to_model,
)
from tinker.proto.response_conv import deserialize_sample_response
from tinker.types import SampleResponse, TensorData

from swarm_gateway.tinker.records import SampledSequence, SampleOutcome
from swarm_gateway.tinker.sampling import PromptTargets, SamplingError, check_last_n, last_n_only
from swarm_gateway.tinker.wire import encode_sample_response


def test_top_k_reaches_the_sdk_as_its_lists() -> None:
    outcome = SampleOutcome(
        sequences=[
            SampledSequence(
                tokens=[5, 7],
                logprobs=[-0.5, -1.0],
                stop_reason="length",
                topk_logprobs=[[(5, -0.5), (2, -1.5)], [(7, -1.0)]],  # a constraint's: fewer
            )
        ],
        prompt_logprobs=[None, -2.0, -3.0],
        topk_prompt_logprobs=[None, [(4, -0.25), (9, -2.0)], [(1, -0.75), (3, -3.0)]],
    )
    response = deserialize_sample_response(encode_sample_response(outcome))
    assert response.prompt_logprobs == [None, -2.0, -3.0]
    assert response.topk_prompt_logprobs == [None, [(4, -0.25), (9, -2.0)], [(1, -0.75), (3, -3.0)]]
    assert response.topk_prompt_logprobs_np is not None
    assert response.topk_prompt_logprobs_np.token_ids.shape == (3, 2)
    [sequence] = response.sequences
    assert sequence.tokens == [5, 7]
    assert sequence.topk_logprobs == [[(5, -0.5), (2, -1.5)], [(7, -1.0)]]
    # Not asked: none at all.
    plain = SampleOutcome(sequences=[SampledSequence(tokens=[1], stop_reason="stop")])
    decoded = deserialize_sample_response(encode_sample_response(plain))
    assert decoded.topk_prompt_logprobs is None
    assert decoded.sequences[0].topk_logprobs is None
    assert decoded.sequences[0].tokens == [1]
    assert decoded.prompt_logprobs is None


def _sdk_json(tensor: TensorData) -> dict[str, Any]:
    """What the SDK sends for a ``TensorData`` in a ``SampleRequest`` (its own conversion)."""
    return _tensor_data_to_model(tensor).model_dump()


def _answer(targets: PromptTargets, logprob_of: dict[int, float]) -> SampleResponse:
    """The engine's answer (a made-up log-probability per id) in the request's layout, through
    the gateway's encoding and the SDK's decoder."""
    packed = [[logprob_of.get(t, 0.0) if t >= 0 else 0.0 for t in row] for row in targets.packed]
    outcome = SampleOutcome(
        sequences=[SampledSequence(tokens=[1], stop_reason="length")],
        target_prompt_logprobs=targets.answer(packed),
    )
    return deserialize_sample_response(encode_sample_response(outcome))


def test_target_prompt_logprobs_come_back_in_the_requests_layout() -> None:
    logprob_of = {5: -0.5, 9: -1.25, 2: -3.0, 4: -0.125}
    ids = torch.tensor([[5, -1, 9], [-1, -1, -1], [-1, 2, -1], [4, 5, 9]])  # 5-token prompt
    dense = PromptTargets.parse(_sdk_json(TensorData.from_torch(ids)), 5)
    assert dense.packed == [[5, 9, -1], [-1, -1, -1], [2, -1, -1], [4, 5, 9]]
    expected = torch.tensor(
        [[-0.5, 0.0, -1.25], [0.0, 0.0, 0.0], [0.0, -3.0, 0.0], [-0.125, -0.5, -1.25]]
    )
    decoded = _answer(dense, logprob_of).target_prompt_logprobs
    assert decoded is not None
    assert decoded.dtype == "float32"
    assert decoded.shape == [4, 3]
    assert torch.equal(decoded.to_torch(), expected)
    # Sparse CSR (few cells named, so the SDK sends CSR): the same indices back.
    few = torch.full((6, 4), -1, dtype=torch.int64)
    few[0, 3], few[4, 1], few[4, 2] = 9, 2, 5
    sdk_sparse = TensorData.from_torch_sparse(few, pad_value=-1)
    assert sdk_sparse.sparse_crow_indices is not None
    sparse = PromptTargets.parse(_sdk_json(sdk_sparse), 7)
    assert sparse.packed == [[9, -1], [-1, -1], [-1, -1], [-1, -1], [2, 5], [-1, -1]]
    back = _answer(sparse, logprob_of).target_prompt_logprobs
    assert back is not None
    assert back.sparse_crow_indices == sdk_sparse.sparse_crow_indices
    assert back.sparse_col_indices == sdk_sparse.sparse_col_indices
    expected_sparse = torch.zeros(6, 4)  # the unlisted cells: 0.0
    expected_sparse[0, 3], expected_sparse[4, 1], expected_sparse[4, 2] = -1.25, -3.0, -0.5
    assert torch.equal(back.to_torch(), expected_sparse)


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ({"data": [1.5], "dtype": "float32", "shape": [1, 1]}, "int64"),
        ({"data": [1, 2], "dtype": "int64", "shape": [2, 1]}, r"\[1, K\]"),
        ({"data": [1, 2], "dtype": "int64", "shape": [1, 1]}, "2 values"),
        ({"data": [-1, -1], "dtype": "int64", "shape": [1, 2]}, "no token id"),
        ({"data": [-2], "dtype": "int64", "shape": [1, 1]}, "-1 for a cell"),
        ({"data": list(range(21)), "dtype": "int64", "shape": [1, 21]}, "at most 20"),
        (
            {
                "data": [3],
                "dtype": "int64",
                "shape": [1, 2],
                "sparse_crow_indices": [0, 1],
                "sparse_col_indices": [2],
            },
            "CSR",
        ),
    ],
)
def test_a_target_tensor_the_gateway_cannot_serve_is_a_400_naming_the_field(
    raw: dict[str, Any], why: str
) -> None:
    with pytest.raises(SamplingError, match=f"target_prompt_logprobs: .*{why}"):
        PromptTargets.parse(raw, 2)


def test_prompt_alt_tokens_reach_the_sdk_as_two_dense_tensors() -> None:
    draws = [[(3, -1.0), (3, -1.0)], [(8, -0.25), (1, -2.5)]]
    outcome = SampleOutcome(
        sequences=[SampledSequence(tokens=[1], stop_reason="stop")], prompt_alt_tokens=draws
    )
    alt = deserialize_sample_response(encode_sample_response(outcome)).prompt_alt_tokens
    assert alt is not None
    assert alt.tokens.dtype == "int64"
    assert alt.logprobs.dtype == "float32"
    assert alt.tokens.to_torch().tolist() == [[3, 3], [8, 1]]
    assert alt.logprobs.to_torch().tolist() == [[-1.0, -1.0], [-0.25, -2.5]]


def test_last_n_leaves_the_earlier_prompt_positions_unscored_as_the_sdk_checks() -> None:
    prompt = [None, -1.0, -2.0, -3.0, -4.0]
    topk = [None, [(1, -1.0)], [(2, -2.0)], [(3, -3.0)], [(4, -4.0)]]
    cut, cut_topk = last_n_only(5, 2, prompt, topk)
    outcome = SampleOutcome(
        sequences=[SampledSequence(tokens=[1], stop_reason="stop")],
        prompt_logprobs=cut,
        topk_prompt_logprobs=cut_topk,
    )
    response = deserialize_sample_response(encode_sample_response(outcome))
    assert response.prompt_logprobs == [None, None, None, -3.0, -4.0]
    assert response.topk_prompt_logprobs == [None, None, None, [(3, -3.0)], [(4, -4.0)]]
    _check_prompt_logprobs_last_n_honored(response, 2)  # the SDK's own check: no error
    assert last_n_only(5, None, prompt, topk) == (prompt, topk)
    for last_n, prompt_logprobs, why in (
        (0, True, "1..len"),
        (5, True, "1..len"),
        (2, False, "goes with"),
    ):
        with pytest.raises(SamplingError, match=f"prompt_logprobs_last_n: .*{why}"):
            check_last_n(last_n, prompt_logprobs, 5)
