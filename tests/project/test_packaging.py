import importlib.metadata
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("rl", "rollout_engine", "pagedrl_kernels", "envs", "serve", "host")


@pytest.mark.parametrize("name", PACKAGES)
def test_top_level_package_comes_from_this_repo(name):
    origin = Path(importlib.util.find_spec(name).origin)
    assert origin.is_relative_to(REPO)


@pytest.mark.parametrize("name", PACKAGES)
def test_no_other_installed_distribution_claims_the_name(name):
    # A name another installed distribution claims fights ours for the import: Hugging Face's `kernels`, which
    # transformers 5.25 installs and imports, is why the kernels' package is `pagedrl_kernels`.
    owners = set(importlib.metadata.packages_distributions().get(name, []))
    assert owners == {"pagedrl"}


def test_packages_resolve_to_the_repo_from_any_directory(tmp_path):
    modules = ", ".join(PACKAGES)
    code = f"import {modules}; print('\\n'.join(m.__file__ for m in ({modules})))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert all(Path(line).is_relative_to(REPO) for line in out.stdout.split())
