"""vLLM's model-registry cache, answered ahead of time so that no pod start pays for it.

Before vLLM builds an engine it inspects the model's architecture class (does it take images, support LoRA,
pipeline parallelism, ...). Unless the cache under `$VLLM_CACHE_ROOT/modelinfos` already holds the answer for
the exact source of that class's module, vLLM imports the module in a new Python process to find out: 14 s of
the 47 s a tiny model's start takes on two idle cores, paid again by every pod whose cache volume is new.

- `seed(folder)` answers for every architecture vLLM registers, in this one process: 17 s for vLLM 0.32's
  387 architectures, 1.4 MB of JSON. The runtime images run it at build time (`python3 modelinfo.py FOLDER`,
  in the engine's layer: this file needs only vLLM) and set PAGODA_VLLM_SEED_DIR to the folder.
- `install()`, at the start of `serve`, copies the answers the pod's cache lacks from PAGODA_VLLM_SEED_DIR.

vLLM checks each answer against the hash of its module's source before it uses it, so an answer made by
another vLLM version is re-inspected and replaced, never trusted. `seed` runs the inspection in-process where
vLLM uses a subprocess (so that its API server never initialises CUDA): at build time there is no GPU, and
the process exits afterwards.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from pathlib import Path

SEED_ENV = "PAGODA_VLLM_SEED_DIR"
SUBDIR = "modelinfos"  # vLLM's name, under its cache root

log = logging.getLogger("pagoda.runtime.models.modelinfo")


def seed(folder: Path) -> tuple[int, list[str]]:
    """Writes vLLM's model-info cache for every registered architecture under `folder` (a VLLM_CACHE_ROOT);
    returns how many were answered and the architectures that could not be inspected (with why)."""
    os.environ["VLLM_CACHE_ROOT"] = str(folder)  # vLLM reads it on each use (vllm.envs)
    from vllm.model_executor.models import registry

    registry._run_in_subprocess = lambda fn: fn()  # see the module's docstring
    answered, failed = 0, []
    for arch in sorted(registry.ModelRegistry.get_supported_archs()):
        try:
            registry.ModelRegistry.models[arch].inspect_model_cls()
            answered += 1
        except Exception as exc:  # noqa: BLE001 - an architecture whose optional dependency is missing
            failed.append(f"{arch} ({type(exc).__name__}: {str(exc)[:120]})")
    return answered, failed


def install() -> int:
    """Copies the seeded answers that vLLM's cache (VLLM_CACHE_ROOT) lacks; returns how many. Nothing to do
    without PAGODA_VLLM_SEED_DIR; a seed folder that is not there is logged and skipped (the engine still
    starts, only slower)."""
    seed_dir = os.environ.get(SEED_ENV)
    if not seed_dir:
        return 0
    source = Path(seed_dir) / SUBDIR
    if not source.is_dir():
        log.warning("No model-info seed %s=%s: vLLM inspects the architecture itself", SEED_ENV, seed_dir)
        return 0
    from vllm import envs

    target = Path(envs.VLLM_CACHE_ROOT) / SUBDIR
    copied = 0
    try:
        target.mkdir(parents=True, exist_ok=True)
        for answer in source.glob("*.json"):
            destination = target / answer.name
            if not destination.exists():
                shutil.copy2(answer, destination)  # keeps the seed's mtime: a re-inspection shows as newer
                copied += 1
    except OSError as exc:  # an optimisation only: the engine still starts (vLLM names what it cannot write)
        log.warning("Could not seed vLLM's model-info cache into=%s error=%s", target, exc)
        return copied
    log.info("Seeded vLLM's model-info cache files=%d from=%s into=%s", copied, source, target)
    return copied


def main(argv: list[str]) -> int:
    """`python3 modelinfo.py FOLDER`, the images' build step (or `pagoda-runtime seed-model-info`)."""
    if len(argv) != 1:
        print("usage: modelinfo.py FOLDER  (writes FOLDER/modelinfos)", file=sys.stderr)
        return 2
    answered, failed = seed(Path(argv[0]))
    print(f"model-info answers for {answered} architectures in {Path(argv[0]) / SUBDIR}")
    for line in failed:
        print(f"  not inspected: {line}")
    return 0 if answered else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
