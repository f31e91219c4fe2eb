"""A non-editable install works outside the checkout: grammar, templates and package ship."""

import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FIDEF = """\
family scale {
  op_type scale
  axes {
    n : var
    d : const d
  }
  inputs {
    x : float32[n, d]
  }
  outputs {
    y : float32[n, d]
  }
  reference \"\"\"
    def run(x):
        return x * 2
  \"\"\"
  instances {
    d=8
  }
}
"""


def test_wheel_install_builds_outside_the_checkout(tmp_path: Path):
    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheels),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=True, with_pip=True)
    python = env_dir / "bin" / "python"
    (wheel,) = wheels.glob("fibgen-*.whl")
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)],
        check=True,
        capture_output=True,
    )
    work = tmp_path / "work"
    (work / "defs").mkdir(parents=True)
    (work / "defs" / "scale.fidef").write_text(FIDEF)
    fibgen = env_dir / "bin" / "fibgen"
    proc = subprocess.run(
        [str(fibgen), "build", "defs", "-o", "out"], cwd=work, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert (work / "out" / "definitions" / "scale" / "scale_d8.json").is_file()
    # The grammar came from the installed package, not from this checkout.
    where = subprocess.run(
        [str(python), "-c", "from fibgen.paths import grammars_dir; print(grammars_dir())"],
        cwd=work,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert str(ROOT) not in where and "site-packages" in where
    demo = subprocess.run(
        [str(python), "-m", "fibgen.demo"], cwd=work, capture_output=True, text=True
    )
    assert demo.returncode == 0, demo.stderr
