"""Arguments the Python client cannot send raise ValueError or TypeError naming the argument
and what it accepts, never a bare KeyError (issue 38, wall 3): output_dtype (a name, or a
NumPy or PyTorch dtype that maps to float32, bfloat16 or float16), model_version, arrays of
other dtypes (named: query, key, key_padding_mask, tokens...), the model name, flags
(is_causal, need_weights...), request_id, ttl_s, session kinds and model control's model_name. The accepted spellings reach the request as the DataType
they name.

Needs no server (the arguments are refused before any call; the requests are built with the
client's own request builders). Run by CTest as python_argument_errors_test (ATTENTION_PY_GEN
and PYTHONPATH set there).
"""
import asyncio
import unittest

try:  # Third-party modules: their absence is a skip with the reason.
    import grpc  # noqa: F401
    import numpy as np
    MISSING = None
except ImportError as e:
    MISSING = str(e)
if not MISSING:  # The package's own names: missing ones fail the test.
    from attention_client import AttentionClient
    from attention_client.aio import AsyncAttentionClient
    from attention_client.session import _append_request
    from attention_client.stubs import attention_pb2

ACCEPTED = "'float32', 'bfloat16' or 'float16'"


@unittest.skipIf(MISSING, f"dependencies missing: {MISSING}")
class ArgumentErrorsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.client = AttentionClient("127.0.0.1:1", timeout=1)  # Never reached.
        cls.query = np.zeros((1, 2, 8), np.float32)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()

    def refused(self, error, function, *args, **kwargs):
        with self.assertRaises(error) as ctx:
            function(*args, **kwargs)
        return str(ctx.exception)

    def test_output_dtype_refused_with_the_accepted_values(self):
        for bad in ("float64", np.float64, "fp16", np.int8, 3):
            message = self.refused(ValueError, self.client.infer, self.query, output_dtype=bad)
            self.assertTrue(message.startswith("output_dtype: expected "), message)
            self.assertIn(ACCEPTED, message)
            self.assertIn(repr(bad), message)
        message = self.refused(ValueError, _append_request, "s", self.query[0],
                               output_dtype="float64")
        self.assertIn(f"output_dtype: expected {ACCEPTED}", message)

        async def asyncio_infer():
            async with AsyncAttentionClient("127.0.0.1:1", timeout=1) as client:
                await client.infer(self.query, output_dtype=np.float64)
        self.assertIn(ACCEPTED, self.refused(ValueError, asyncio.run, asyncio_infer()))

    def test_output_dtype_accepts_numpy_and_torch_dtypes(self):
        dtypes = {None: attention_pb2.DATA_TYPE_UNSPECIFIED,
                  "float32": attention_pb2.DATA_TYPE_FLOAT32, np.float32:
                  attention_pb2.DATA_TYPE_FLOAT32, np.dtype("<f4"):
                  attention_pb2.DATA_TYPE_FLOAT32, "float16": attention_pb2.DATA_TYPE_FLOAT16,
                  np.float16: attention_pb2.DATA_TYPE_FLOAT16, np.dtype(">f2"):
                  attention_pb2.DATA_TYPE_FLOAT16, "bfloat16": attention_pb2.DATA_TYPE_BFLOAT16}
        try:
            import torch
            dtypes.update({torch.float32: attention_pb2.DATA_TYPE_FLOAT32,
                           torch.float16: attention_pb2.DATA_TYPE_FLOAT16,
                           torch.bfloat16: attention_pb2.DATA_TYPE_BFLOAT16})
        except ImportError:
            pass
        for given, expected in dtypes.items():
            request = AttentionClient._infer_request(self.query, output_dtype=given)
            self.assertEqual(request.output_dtype, expected, given)
            self.assertEqual(_append_request("s", self.query[0], output_dtype=given)
                             .output_dtype, expected, given)

    def test_model_version(self):
        for given, expected in ((0, 0), (2, 2), ("3", 3), ("", 0), (None, 0),
                                (np.int64(4), 4)):
            self.assertEqual(AttentionClient._infer_request(
                self.query, model_version=given).model_version, expected)
        for bad in ("latest", -1, 1.5, True, 2**70):
            message = self.refused(ValueError, self.client.infer, self.query,
                                   model_version=bad)
            self.assertTrue(message.startswith("model_version: expected a version number"),
                            message)

    def test_arrays_of_other_dtypes_name_the_argument(self):
        for argument in ("query", "key", "value", "key_padding_mask", "attn_mask"):
            arrays = {"query": self.query, argument: np.zeros((1, 2, 8), np.int64)}
            message = self.refused(TypeError, self.client.infer, **arrays)
            self.assertTrue(message.startswith(f"{argument}: unsupported dtype int64: use "
                                               f"float32, float16 or bool"), message)
        message = self.refused(TypeError, _append_request, "s", np.zeros((2, 8), np.int32))
        self.assertTrue(message.startswith("tokens: unsupported dtype int32"), message)

    def test_names(self):
        message = self.refused(TypeError, self.client.infer, self.query, model=None)
        self.assertTrue(message.startswith("model: expected a model name"), message)
        self.assertIn("model_name: expected a model name",
                      self.refused(ValueError, self.client.load_model, ""))
        self.assertIn("model_name: expected a model name (str), got int 3",
                      self.refused(TypeError, self.client.unload_model, 3))
        self.assertIn("kind: expected 'self' or 'cross', got 'decoder'",
                      self.refused(ValueError, self.client.session, kind="decoder"))

    def test_flags_ids_and_ttl_name_the_argument(self):
        # protobuf's own TypeError ("'yes' has type str, but expected one of: int, bool")
        # names no field.
        for argument, bad, expected in (("is_causal", "yes", "a bool"),
                                        ("need_weights", "no", "a bool"),
                                        ("per_head_weights", 0.5, "a bool"),
                                        ("request_id", 5, "a str")):
            message = self.refused(TypeError, self.client.infer, self.query, **{argument: bad})
            self.assertTrue(message.startswith(f"{argument}: expected {expected}, got "),
                            message)
        message = self.refused(TypeError, _append_request, "s", self.query[0],
                               need_weights="yes")
        self.assertTrue(message.startswith("need_weights: expected a bool"), message)
        message = self.refused(TypeError, self.client.session, ttl_s="60")
        self.assertTrue(message.startswith("ttl_s: expected an int"), message)
        self.assertEqual(AttentionClient._infer_request(self.query, is_causal=np.bool_(True))
                         .is_causal, True)


if __name__ == "__main__":
    unittest.main()
