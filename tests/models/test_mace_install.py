"""Installation facts that hold with and without mace-torch: e3nn imports under weights-only
loading (e3nn 0.4.4, mace-torch's pin, and the newest), and a clear error without mace-torch."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

HAS_MACE = importlib.util.find_spec("mace") is not None


def test_e3nn_imports_after_mlip_unc_nn_in_a_fresh_interpreter():
    """``import mlip_unc.nn`` first lets e3nn load its constants with weights_only=True."""
    code = (
        "import mlip_unc.nn, torch\n"
        "from e3nn import o3\n"
        "assert slice in torch.serialization.get_safe_globals()\n"
        "print(o3.Irreps('2x0e+1x1o').dim)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "5"


@pytest.mark.skipif(HAS_MACE, reason="mace-torch is installed")
def test_mace_backbones_name_the_install_command_without_mace():
    from mlip_unc.models.backbones import build_backbone

    for name, kwargs in (
        ("mace", {"num_types": 2}),
        ("mace_model", {"mace_class": "ScaleShiftMACE", "mace_config": {}}),
    ):
        with pytest.raises(ImportError, match=r'pip install -e ".*\[mace\]"'):  # a checkout
            build_backbone(name, **kwargs)
