"""Runs in the cluster (runtime image): writes a tiny safetensors model and uploads it to the e2e S3 server.

Prints the expected digest of every tensor as JSON, which the GPU check compares against.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import boto3
import numpy as np
from safetensors.numpy import save_file


def tensors() -> dict[str, np.ndarray]:
    """A deterministic two-layer "model": a few MiB, mixed dtypes, one tensor of odd length."""
    rng = np.random.default_rng(20261129)
    return {
        "embed.weight": rng.standard_normal((1024, 256), dtype=np.float32),
        "layer0.weight": rng.standard_normal((256, 256), dtype=np.float32).astype(np.float16),
        "layer0.bias": rng.standard_normal((257,), dtype=np.float32),
        "lm_head.weight": rng.standard_normal((256, 1024), dtype=np.float32).astype(np.float16),
    }


def main() -> None:
    model = tensors()
    bucket, prefix = os.environ["S3_BUCKET"], os.environ["S3_PREFIX"]
    s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT"])
    s3.create_bucket(Bucket=bucket)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.safetensors"
        save_file(model, str(path))
        s3.upload_file(str(path), bucket, f"{prefix}/model.safetensors")
    config = {"architectures": ["StrataE2ETiny"], "hidden_size": 256, "vocab_size": 1024}
    s3.put_object(Bucket=bucket, Key=f"{prefix}/config.json", Body=json.dumps(config).encode())
    digests = {name: hashlib.sha256(array.tobytes()).hexdigest() for name, array in model.items()}
    print(json.dumps({"uploaded": f"s3://{bucket}/{prefix}", "tensors": digests}))


if __name__ == "__main__":
    main()
