"""`KVTransferParams` from a request's JSON: what is taken, and the error naming a bad field."""

import pytest

from messages import KVTransferParams
from messages.kv_transfer_params import InvalidKVTransferParams


def test_json_fields_are_read_into_the_dataclass_and_null_leaves_them_unset():
    params = KVTransferParams.from_json(
        {
            "do_remote_prefill": True,
            "remote_engine_id": "prefill-0",
            "remote_request_id": None,
            "remote_block_ids": [3, 4],
            "remote_block_hashes": ["00ff"],
            "prompt_token_ids": [1, 2],
            "kv_sent_s": 2,
        }
    )
    assert params == KVTransferParams(
        do_remote_prefill=True,
        remote_engine_id="prefill-0",
        remote_block_ids=(3, 4),
        remote_block_hashes=(b"\x00\xff",),
        prompt_token_ids=[1, 2],
        kv_sent_s=2.0,
    )
    assert KVTransferParams.from_json({}) == KVTransferParams()


def test_the_address_fields_vllms_nixl_connector_sends_are_taken_and_unused():
    sent = {"do_remote_prefill": True, "remote_host": "10.0.0.2", "remote_port": 5600, "tp_size": 1}
    assert KVTransferParams.from_json(sent) == KVTransferParams(do_remote_prefill=True)


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        (
            {"remote_blok_ids": [1]},
            "kv_transfer_params.remote_blok_ids",
            "unknown field ([1]); allowed: do_remote_decode",
        ),
        (
            {"do_remote_decode": "yes"},
            "kv_transfer_params.do_remote_decode",
            "'yes' is not allowed; expected a boolean",
        ),
        ({"do_remote_decode": None}, "kv_transfer_params.do_remote_decode", "expected a boolean"),
        ({"prompt_token_ids": ["x"]}, "kv_transfer_params.prompt_token_ids", "expected a list of ints"),
        ({"kv_sent_s": True}, "kv_transfer_params.kv_sent_s", "expected a number"),
        ({"remote_block_hashes": ["zz"]}, "kv_transfer_params.remote_block_hashes", "hex strings"),
    ],
)
def test_an_unknown_or_mistyped_field_is_named_with_its_value_and_what_is_allowed(body, param, says):
    with pytest.raises(InvalidKVTransferParams) as e:
        KVTransferParams.from_json(body)
    assert e.value.param == param and str(e.value).startswith(f"{param}: ") and says in str(e.value)
