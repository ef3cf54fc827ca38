"""A fit's bytes do not depend on the CPU it runs on.

Short fits of all three models, run natively and under qemu emulating an AMD EPYC (another
vendor, no AVX-512, and software versions of the approximate reciprocal-square-root
instructions whose bits differ from the hardware's), must agree bit for bit.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="fitting needs PyTorch (requirements-fit.txt)")

import dynshape_perception  # noqa: E402
from dynshape_perception.tools.fit.torch_models import exact_sqrt  # noqa: E402

QEMU = "qemu-x86_64-static"
EMULATED_CPU = "EPYC-Rome"
# Emulation runs the three short fits in about 1.5 minutes on one idle core.
EMULATED_TIMEOUT_S = 1200

PROBE = """
import json
import dynshape_perception.tools.fit
from dynshape_perception.tools.fit import associator, predictor, segmenter
from dynshape_perception.tools.fit.data import GeneratedFamilies, SyntheticPedestrians
from dynshape_perception.models import model_definition
from dynshape_perception.models.weights import weights_checksum

fits = {
    "associator": lambda model: associator.fit_associator(model, ("synthetic",), 0,
        associator.AssociatorFitConfig(scenes=2, pairs_per_scene=500, steps=16, batch_size=256)),
    "segmenter": lambda model: segmenter.fit_segmenter(model, ("synthetic",), 0,
        segmenter.SegmenterFitConfig(scenes=1, steps=16, batch_size=512)),
    "predictor": lambda model: predictor.fit_predictor(model, ("synthetic",), 0,
        predictor.PredictorFitConfig(steps=16, batch_size=64, relax_steps=4, long_share=0.5,
                                     synthetic=SyntheticPedestrians(scenes=1, agents=8),
                                     families=GeneratedFamilies(scenes=1))),
}
print(json.dumps({name: weights_checksum(fit(model_definition(name))[0])
                  for name, fit in fits.items()}))
"""


def _probe(prefix: list[str]) -> subprocess.Popen[str]:
    # -S: no site hooks, so no .pth re-executes the interpreter natively from under qemu.
    roots = [sysconfig.get_path("purelib"), str(Path(dynshape_perception.__file__).parents[1])]
    return subprocess.Popen(
        [*prefix, sys.executable, "-S", "-c", PROBE],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(roots)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _digests(proc: subprocess.Popen[str], timeout_s: float) -> dict[str, str]:
    out, err = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, err[-2000:]
    return dict(json.loads(out.strip().splitlines()[-1]))


@pytest.mark.slow
def test_short_fits_give_the_same_bytes_on_an_emulated_amd_cpu() -> None:
    qemu = shutil.which(QEMU)
    if qemu is None:
        reason = f"{QEMU} is missing (make system-deps)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    emulated = _probe([qemu, "-cpu", EMULATED_CPU])
    try:
        native = _digests(_probe([]), EMULATED_TIMEOUT_S)
        assert _digests(emulated, EMULATED_TIMEOUT_S) == native
    finally:
        emulated.kill()
        emulated.wait()


def test_exact_sqrt_is_correctly_rounded_where_torch_sqrt_need_not_be() -> None:
    x = torch.rand(100_000, generator=torch.Generator().manual_seed(0)) * 100
    rounded = np.sqrt(x.numpy().astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(exact_sqrt(x).numpy(), rounded)


def test_exact_sqrt_has_the_gradient_of_torch_sqrt() -> None:
    x = torch.tensor([0.25, 1.0, 9.0, 0.01], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(exact_sqrt, (x,))
    exact_sqrt(x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 0.5 / np.sqrt(x.detach().numpy()), rtol=1e-15)
