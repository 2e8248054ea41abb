"""The gateway's ``SampleResponse`` read back by the stock SDK's own decoder: top-k as dense
(length, k) matrices, the SDK's sentinels where a position has fewer or none."""

from __future__ import annotations

from tinker.proto.response_conv import deserialize_sample_response

from swarm_gateway.tinker.records import SampledSequence, SampleOutcome
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
