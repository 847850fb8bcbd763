"""benchmarks/estimator_variance.py runs end to end (tiny sizes, untrained model): every variant prints a
row of finite figures, so that the study cannot break unnoticed when the code it calls moves."""

import importlib.util
import math
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "estimator_variance.py"


def test_estimator_study_prints_every_variant():
    spec = importlib.util.spec_from_file_location("estimator_variance", SCRIPT)
    estimator_variance = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(estimator_variance)  # its variants (the script's main() does not run)
    proc = subprocess.run([sys.executable, str(SCRIPT), "--samples", "2", "--reference-samples", "2",
                           "model.d_model=32", "model.n_heads=2", "train.seq_len=64", "train.batch_size=8"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split("|")[1].strip(): line.split("|")[2:-1] for line in proc.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| variant")}
    assert set(rows) == set(estimator_variance.VARIANTS)
    assert "draw 0.25" in rows and rows["draw 0.25"][0].strip() == "8 x 1"
    for cells in rows.values():
        assert all(math.isfinite(float(c)) for c in cells[1:])
